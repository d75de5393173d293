"""Policy-gradient losses, the GRPO/GSPO loop, SFT, checkpoints and metrics."""
