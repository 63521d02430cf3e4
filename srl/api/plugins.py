"""Plugins: algorithms, networks, environments and worker roles named in the YAML, built in or ``module:attr``.

Why here and not as entry points or a registry filled at import: a name in the
experiment file is the only place a plugin is chosen, so resolution happens
once, at the config boundary, with one error line naming the field. There are
no import-time side effects and no global registry a test would have to reset.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any

from srl.api.config import ConfigError

MAIN = "__main__"
"""The module of the program that runs now: a training script, ``srl``, a test runner."""


def resolve(spec: str, builtins: Mapping[str, str], field: str, callable_: bool = True) -> Any:
    """The object ``spec`` names: a built-in name (``ppo``) or ``package.module:attr`` (``attr`` may be dotted);
    ``callable_``: it must be a class or function (not a declaration such as a role)."""
    target = builtins.get(spec, spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(sorted(builtins)) or "none"
        raise ConfigError(f"{field}: {spec!r} is neither a built-in name ({known}) nor 'package.module:attr'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{field}: cannot import module {module_name!r} ({exc})") from None
    for name in attr.split("."):
        if not hasattr(obj, name):
            raise ConfigError(_missing(field, module_name, attr))
        obj = getattr(obj, name)
    if callable_ and not callable(obj):
        raise ConfigError(f"{field}: {target!r} is not callable")
    return obj


def _missing(field: str, module_name: str, attr: str) -> str:
    """The line for a module without ``attr``; for ``__main__``, why: it is whichever program runs now, so a
    plugin a script defined for itself is not there when another program (``srl train``, ``srl eval``) looks."""
    if module_name != MAIN:
        return f"{field}: {module_name!r} has no attribute {attr!r}"
    return (
        f"{field}: '{MAIN}:{attr}' is not in this program's {MAIN}; what a script defines in its {MAIN} exists only "
        f"while that script runs: move {attr!r} to an importable module and name it 'module:{attr}'"
    )


def missing_from_main(spec: str) -> str | None:
    """The attribute ``spec`` names in ``__main__`` when this program's ``__main__`` lacks it (a plugin the
    script that trained a run defined for itself, looked up by another program), else None."""
    module_name, _, attr = spec.partition(":")
    if module_name != MAIN or not attr:
        return None
    obj: Any = sys.modules.get(MAIN)
    for name in attr.split("."):
        if not hasattr(obj, name):
            return attr
        obj = getattr(obj, name)
    return None


def instance_of(obj: Any, module: str, name: str) -> bool:
    """``isinstance(obj, module.name)``, without importing ``module``.

    An object of a class (or of a subclass) exists only once the class's module is imported, so a module that is
    not in ``sys.modules`` answers no. Asking which kind of env a factory returned then costs nothing for
    backends the run does not use (importing OpenSpiel, PettingZoo and VMAS to answer no took 0.17 s of
    CartPole's time to solve)."""
    cls = getattr(sys.modules.get(module), name, None)
    return isinstance(cls, type) and isinstance(obj, cls)
