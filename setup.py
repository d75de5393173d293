"""spatial-jax: JAX-native RL post-training of vision-language models with spatially grounded rewards."""

from setuptools import find_packages, setup

# every package under spatial_jax/ (a listed set missed data.sources and would miss the next one in a wheel)
PACKAGES = find_packages(include=["spatial_jax", "spatial_jax.*"])

setup(
    name="spatial-jax",
    version="0.1.0",
    description="JAX-native RL post-training of vision-language models with spatially grounded rewards",
    python_requires=">=3.11",
    packages=PACKAGES,
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        # the JAX libraries the step, its checkpoints and the data order rest on, exact: a release of any of them
        # could change a figure or a checkpoint's layout with no commit here (as transformers 5.25 broke CI)
        "flax==0.12.8",
        "optax==0.2.8",
        "orbax-checkpoint==0.12.8",
        "grain==0.2.18",
        # the parity tests hold data and model to one transformers minor (5.25 changed the video prompt and brought a
        # dependency that a top-level kernels/ folder shadowed); a new minor is taken by a commit that reruns them
        "transformers~=5.25.0",
        "safetensors>=0.5",
        "numpy>=2.0",
        "scipy>=1.13",
        # torch backs the reference scorers and the Triton kernel; 2.13.0 CPU is the build on these machines.
        "torch==2.13.0",
        "triton>=3.4",
        "tensorboardX>=2.6",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "pillow>=10.1",
        # the benchmarks' published copies: parquet tables and mp4 videos
        "pyarrow>=15",
        "av>=12",
    ],
    extras_require={
        # libtpu (jax[tpu]) lets the tests compile the Pallas kernels with the real XLA:TPU compiler on a CPU machine.
        # The docs packages are exact: CI builds the site with warnings as errors, and a theme or plug-in release
        # could add a warning with no commit here.
        "test": ["pytest>=8", "pytest-xdist>=3.6", "hypothesis>=6.100", "ruff==0.17.6", "jax[tpu]==0.10.2",
                 "mkdocs==1.6.1", "mkdocs-material==9.8.2", "mkdocstrings[python]==1.0.8",
                 "mkdocstrings-python==2.0.11"],
        # tools/mutation.sh: mutation testing of one module with its own tests (a developer tool, not run by CI)
        "mutation": ["mutmut==3.8.1"],
        # benchmarks/papers/vs_trl.py: TRL's GRPOTrainer beside the project's RL step, with the versions its table was
        # measured with (against torch 2.13.0 CPU above)
        "bench": ["trl==1.16.0", "accelerate==1.16.0", "datasets==5.2.0"],
        # tests/test_rollout_correction_verl.py: verl 0.9.1's own rollout correction and policy losses. verl itself goes
        # in with `pip install --no-deps verl==0.9.1` (its requirements pin a transformers below this project's); these
        # are the modules its rollout_corr_helper and core_algos import, at versions inside verl's own ranges
        "verl": ["ray==2.60.0", "tensordict==0.10.0", "omegaconf==2.4.0", "codetiming==1.4.0", "orjson==3.13.0"],
        "gpu": ["jax[cuda12]==0.10.2"],
        "tpu": ["jax[tpu]==0.10.2"],
    },
    entry_points={"console_scripts": ["spatial-jax=spatial_jax.cli:entry"]},
)
