"""The methods, one plug-in module each. A new method is one module here that calls `register`, plus its name in
`_PLUGINS`; nothing else in the tree names it."""

import importlib

from spatial_jax.methods.base import METHODS, Method, get_method, register

_PLUGINS = ("spatialcore", "prosr", "spatialthinker", "allospatial")
for _name in _PLUGINS:
    importlib.import_module(f"spatial_jax.methods.{_name}")

__all__ = ["METHODS", "Method", "get_method", "register"]
