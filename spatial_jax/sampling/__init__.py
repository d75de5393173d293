"""The jitted KV-cache sampler."""
