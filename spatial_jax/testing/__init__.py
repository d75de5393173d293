"""Code only tests and benchmarks use: synthetic rollouts with plausible token traces."""
