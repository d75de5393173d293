"""spatial-jax: JAX-native RL post-training of vision-language models with spatially grounded rewards."""

import os as _os

__version__ = "0.1.0"

# setup.py installs the top-level kernels/ folder as spatial_jax.kernels. When this package is imported straight from
# a source checkout (the repo root on sys.path shadows the installed mapping), let submodule lookup see that folder.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "kernels", "__init__.py")) and not _os.path.isdir(
    _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "kernels")
):
    __path__.append(_root)
