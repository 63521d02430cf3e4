"""Typed building of a config dataclass from a plain mapping, and back (:func:`build`, :func:`to_dict`).

Every field is checked against its annotation: unknown keys, wrong types and out-of-range values raise a
:class:`ConfigError` naming the dotted field path.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from srl.api.config.errors import ConfigError

_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
"""A number in exponent notation, which YAML 1.1 reads as a number only with a dot in the mantissa."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, name: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it converted (lists to tuples, ints to floats)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return build(tp, value, prefix=f"{name}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, name)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{name}: {value!r} matches none of {_type_name(tp)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{name}: must be one of {', '.join(map(str, args))}; got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value))
    if origin in (collections.abc.Mapping, dict) or tp is Mapping:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{name}: expected a mapping with string keys, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 (PyYAML) reads 1e-4, without a dot, as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{name}: unsupported field type {_type_name(tp)}")  # pragma: no cover


def build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown field (known: {', '.join(sorted(names))})")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in data and _required(f)]
    if missing:
        raise ConfigError(f"{prefix}{missing[0]}: missing (it has no default)")
    kwargs = {key: _coerce(value, hints[key], f"{prefix}{key}") for key, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{prefix}{exc}") from None


def _required(f: dataclasses.Field[Any]) -> bool:
    """Whether a dataclass field must be given (it has no default)."""
    return f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain, YAML-friendly dict of a config (tuples become lists)."""

    def plain(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, Mapping):
            return {k: plain(x) for k, x in v.items()}
        return v

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}
