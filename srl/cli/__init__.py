"""srl.cli"""

from __future__ import annotations

from typing import Any


def add_overrides(parser: Any, help: str = "override a config field (repeatable)") -> None:
    """The ``--set KEY=VALUE`` flag every command that reads a config takes (into ``args.overrides``)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)
