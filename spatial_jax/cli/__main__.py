"""`python -m spatial_jax.cli ...` runs the `spatial-jax` command (the multi-host test starts processes this way)."""

import sys

from spatial_jax.cli import main

sys.exit(main())
