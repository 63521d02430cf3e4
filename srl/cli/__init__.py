"""srl.cli"""

from __future__ import annotations

from typing import Any


def add_overrides(parser: Any, help: str = "override a config field (repeatable)") -> None:
    """The ``--set KEY=VALUE`` flag every command that reads a config takes (into ``args.overrides``)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def check_device(flag: str, name: str | None) -> str | None:
    """A ``--device`` value: ``cpu``, ``cuda`` or ``cuda:N`` that torch can use here, else one clear line."""
    from srl.api.config import ConfigError
    from srl.api.config.workers import is_device

    if name is None:
        return None
    if not is_device(name):
        raise ConfigError(f"{flag}: must be cpu, cuda or cuda:N, got {name!r}")
    from srl.api.device import torch_device

    try:
        torch_device(name, flag)
    except ValueError as exc:  # no CUDA here
        raise ConfigError(str(exc)) from None
    return name
