"""Test session setup: 8 host devices for sharding tests and Triton's CPU interpreter, set before any import."""

import os
import shutil
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
# The persistent compilation cache, as every job command opens it (spatial_jax/compile_cache.py): a fresh folder per
# session, made by the first process (xdist's workers and the tests' subprocesses inherit it), so the suite's timing
# is a cold start's and a run of the tests leaves no cache behind; tests calling train() in-process open it too.
if "SPATIAL_JAX_COMPILE_CACHE" not in os.environ:
    os.environ["SPATIAL_JAX_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="spatial-jax-test-xla-")
    os.environ["SPATIAL_JAX_TEST_CACHE_OWNER"] = str(os.getpid())


def pytest_configure(config):
    from spatial_jax import compile_cache

    compile_cache.enable()


def pytest_unconfigure(config):
    if os.environ.get("SPATIAL_JAX_TEST_CACHE_OWNER") == str(os.getpid()):
        shutil.rmtree(os.environ["SPATIAL_JAX_COMPILE_CACHE"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Under `pytest -n N` (scheduled `--dist worksteal`, pytest.ini) every worker starts on its share of the slow
    tests. worksteal hands worker k the k-th of N consecutive blocks of the collection and, at the end, moves queued
    tests from a busy worker to an idle one; so each block holds every N-th slow test first, then a run of the fast
    ones in their file order (module fixtures stay together), which are what the stealing evens out."""
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if workers < 2 or config.getoption("dist", "no") != "worksteal":
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    fast = [item for item in items if not item.get_closest_marker("slow")]
    ordered, remaining = [], len(items)
    for k in range(workers):
        size = remaining // (workers - k)  # worksteal's first split of the pending tests
        mine = slow[k::workers]
        take = max(0, size - len(mine))
        ordered += mine + fast[:take]
        fast = fast[take:]
        remaining -= size
    ordered += fast
    items[:] = ordered
