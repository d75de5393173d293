"""Offline scoring, benchmark evaluation, ProSR diagnostics and grounding analyses."""
