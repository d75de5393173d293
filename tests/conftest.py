"""Test session setup: 8 host devices for sharding tests and Triton's CPU interpreter, set before any import."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A job command without --config runs the README main job (configs/tiny_cpu.toml, on the shipped base); the tests'
# commands run TrainConfig's own defaults, the tiny random policy, unless a test names a config.
os.environ["SPATIAL_JAX_DEFAULT_CONFIG"] = ""
# Hypothesis keeps its example database and caches under ./.hypothesis unless told otherwise; a run of the tests
# leaves the working tree as it found it. Read when Hypothesis first stores something, so setting it here is in time.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "spatial-jax-hypothesis"))
