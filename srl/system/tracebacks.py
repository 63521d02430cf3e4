"""A worker's failure as text: its one-line message and the traceback of the user's code.

Why: an exception in a user's env or plugin is a bug in the user's code, and the line that raised it is what the
user needs. Between srl's loop and that line sit frames that are the same in every run (srl's own, the env API's
wrappers from Gymnasium and PettingZoo, the standard library's import machinery), and srl wraps the user's
exception in one that names the env, actor and slot. :func:`user_traceback` keeps the traceback of the exception
at the root of that chain from the first frame outside those on, so ``File "...", line N`` of the user's code
leads. The report crosses a process boundary in the wire format (never pickle), so the traceback travels as text,
formatted in the worker's process where the frames are.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback

__all__ = ["error_line", "error_report", "user_traceback"]

FRAMEWORK = ("srl", "gymnasium", "pettingzoo")
"""Packages whose frames come before the user's code on the way from a worker's loop to an env or plugin."""

MAX_CHARS = 8000
"""A traceback longer than this keeps its end (the frames nearest the error): a report's header is capped."""


class _Libraries:
    """Which files are not the user's: :data:`FRAMEWORK` (the packages imported), the standard library (but not
    the packages installed beside it: ``site-packages`` lies inside its folder on most layouts) and pseudo-files
    (``<frozen importlib._bootstrap>``, ``<string>``)."""

    def __init__(self) -> None:
        paths = sysconfig.get_paths()
        folders = [os.path.dirname(getattr(sys.modules.get(name), "__file__", None) or "") for name in FRAMEWORK]
        self.framework = tuple(os.path.join(f, "") for f in folders if f)
        self.stdlib = os.path.join(paths["stdlib"], "")
        self.installed = tuple(os.path.join(paths[k], "") for k in ("purelib", "platlib"))

    def own(self, filename: str) -> bool:
        if filename.startswith("<") or filename.startswith(self.framework):
            return True
        return filename.startswith(self.stdlib) and not filename.startswith(self.installed)


def user_traceback(exc: BaseException) -> str:
    """The traceback of the exception at the root of ``exc``'s ``raise ... from`` chain, from the first frame of
    the user's code (outside :data:`FRAMEWORK` and the standard library) to where it was raised. When no frame is
    the user's (srl's own failure, or a library called directly), the whole traceback of that exception."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    frames = traceback.extract_tb(root.__traceback__)
    libraries = _Libraries()
    first = next((i for i, f in enumerate(frames) if not libraries.own(f.filename)), None)
    header = "Traceback (most recent call last):\n"
    if first is not None and first > 0:
        header = "Traceback (most recent call last, from the first frame of your code):\n"
    lines = [header, *traceback.format_list(frames[first or 0 :]), *traceback.format_exception_only(type(root), root)]
    text = "".join(lines)
    return text if len(text) <= MAX_CHARS else "...\n" + text[-MAX_CHARS:]


def error_line(exc: BaseException) -> str:
    """``Type: message`` of a worker's failure (capped): the run's error line, or the cause in a restart warning."""
    return f"{type(exc).__name__}: {exc}"[:2000]


def error_report(worker: str, exc: BaseException) -> dict[str, str]:
    """The ``error`` report of a worker that failed with ``exc``: its name, :func:`error_line` and the user's
    traceback (:func:`user_traceback`)."""
    return {"worker": worker, "message": error_line(exc), "traceback": user_traceback(exc)}
