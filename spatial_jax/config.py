"""Typed dataclass configs: loaded from TOML files in configs/ (a file may name a `base` it inherits from),
overridden by `key=value` strings.

Every config in the project is a (possibly nested) dataclass. Unknown keys, wrong types and malformed
overrides raise ConfigError with the offending key, so a bad run fails before anything is compiled. A config value
that names a plug-in (a method, an evaluation protocol) is looked up in that kind's Registry.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key, value or file that cannot be used."""


class Registry(dict[str, T]):
    """Named plug-ins of one kind, each registered once under its `name`; `kind` ("method", "protocol") names them in
    messages. Looking up a name that is not there is a ConfigError listing the known ones."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, item: T) -> T:
        name = item.name
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self[name] = item
        return item

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {sorted(self)}") from None


class FieldError(ValueError):
    """One field's value breaks its rule; `from_dict` prefixes the dotted path of the table it sits in, so the user
    reads `rl.loss.clip_high must be >= 0, got -1.0`."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field} {message}")


# The one validation idiom: each config's __post_init__ states its rules with these. Every numeric rule rejects
# NaN and infinities (a comparison with NaN is False, and `x > 0` accepts inf).
def require(field: str, value: Any, ok: bool, must: str) -> None:
    """Raises FieldError("<field> must <must>, got <value>") unless ok."""
    if not ok:
        raise FieldError(field, f"must {must}, got {value!r}")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_range(cfg: Any, field: str, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False) -> None:
    """`cfg.field` is a finite number in the interval [low, high] (ends open as asked; None: unbounded)."""
    x = getattr(cfg, field)
    ok = _finite(x)
    if ok and low is not None:
        ok = x > low if low_open else x >= low
    if ok and high is not None:
        ok = x < high if high_open else x <= high
    if low is not None and high is not None:
        must = f"lie in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        must = f"be {'>' if low_open else '>='} {low}"
    elif high is not None:
        must = f"be {'<' if high_open else '<='} {high}"
    else:
        must = "be a finite number"
    require(field, x, ok, must)


def check_positive(cfg: Any, *fields: str) -> None:
    for f in fields:
        check_range(cfg, f, 0, low_open=True)


def check_non_negative(cfg: Any, *fields: str) -> None:
    for f in fields:
        check_range(cfg, f, 0)


def check_at_least(cfg: Any, **minimums: int) -> None:
    for f, low in minimums.items():
        check_range(cfg, f, low)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks/converts `value` to the annotated type `tp`; strings from the command line are parsed."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} matches none of {tp}")
    if origin is typing.Literal:
        if isinstance(value, str):
            for a in args:
                if str(a) == value:
                    return a
        if value in args:
            return value
        raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, dict):
            return from_dict(tp, value, prefix=f"{key}.")
        raise ConfigError(f"{key}: expected a table for {tp.__name__}, got {value!r}")
    if origin in (tuple, list):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = [v for v in value.split(",") if v != ""]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected a boolean, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(number):  # no setting of this project takes NaN or an infinity
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{key}: cannot use {value!r} as {tp}")


def _field_defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Builds dataclass `cls` from a nested dict; keys it does not declare are errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or cls.__name__}: expected a table, got {data!r}")
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {[prefix + k for k in unknown]} for {cls.__name__}; "
            f"known: {sorted(types_)}"
        )
    defaults = _field_defaults(cls)
    kwargs = {}
    for k, v in data.items():
        # a partial table keeps the parent's default for the keys it does not set (rl.loss.kind=gspo must not
        # reset rl.loss.kl_coef to LossConfig's own default)
        if isinstance(v, dict) and dataclasses.is_dataclass(defaults.get(k)):
            v = merge(to_dict(defaults[k]), v)
        kwargs[k] = _coerce(v, types_[k], prefix + k)
    try:
        obj = cls(**kwargs)
    except ConfigError:
        raise
    except FieldError as e:
        raise ConfigError(f"{prefix}{e}") from e
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from e
    return obj


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested settings dict as dotted key -> value (`{"rl": {"steps": 2}}` -> `{"rl.steps": 2}`)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`["a.b=1", "c=x"]` -> {"a": {"b": "1"}, "c": "x"}; values stay strings and are typed by the dataclass."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} has an empty key")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r} conflicts with an earlier override of {part!r}")
            node = nxt
        node[parts[-1]] = value
    return out


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def apply_overrides(cfg: T, overrides: Iterable[str] | dict[str, Any]) -> T:
    """Returns a copy of dataclass `cfg` with overrides applied (and re-validated)."""
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    return from_dict(type(cfg), merge(to_dict(cfg), extra))


# how deep `base` chains may go: far beyond any recipe's (two or three), and a guard against a chain of links
MAX_BASES = 16


def load_toml(path: str | Path) -> dict[str, Any]:
    """The settings of one TOML file. A file may start with `base = "other.toml"` (a path relative to the file's own
    folder): it then holds the other file's settings with its own merged over them, table by table, so that a
    recipe states only how it differs from its base. Bases chain; a cycle or a missing base is a ConfigError that
    names the file whose `base` it is."""
    return _load_toml(Path(path), ())[0]


def config_files(path: str | Path) -> list[Path]:
    """The TOML file at `path` and its bases, in the order they are named: every file a job's settings are read
    from, which no command may overwrite."""
    return _load_toml(Path(path), ())[1]


def _load_toml(path: Path, seen: tuple[Path, ...]) -> tuple[dict[str, Any], list[Path]]:
    data = _read_toml(path)
    if "base" not in data:
        return data, [path]
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"config file {path}: base must be the path of a TOML file, got {base!r}")
    here = path.resolve()
    chain = (*seen, here)
    if len(chain) > MAX_BASES:
        raise ConfigError(f"config file {path}: more than {MAX_BASES} bases deep")
    target = here.parent / base
    if target.resolve() in chain:
        raise ConfigError(f"config file {path}: base {base!r} leads back to {target.resolve()} (a cycle)")
    if not target.exists():
        raise ConfigError(f"config file {path}: its base {base!r} ({target}) does not exist")
    inherited, files = _load_toml(target, chain)
    return merge(inherited, data), [path, *files]


def _read_toml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError as e:
        raise ConfigError(f"config file {path} does not exist") from e
    except UnicodeDecodeError as e:  # tomllib reads UTF-8 only
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start})") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: {e}") from e
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from e


def load(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = ()) -> T:
    """Defaults of `cls`, then the TOML file at `path`, then `key=value` overrides, validated at each level."""
    data: dict[str, Any] = {}
    if path is not None:
        data = load_toml(path)
    data = merge(data, parse_overrides(overrides))
    return from_dict(cls, data)
