"""Reading an experiment: the YAML file, ``--set key=value`` overrides and the per-node totals of ``runtime: ray``."""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from srl.api.config.errors import ConfigError
from srl.api.config.experiment import ExperimentConfig
from srl.api.config.parse import build


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b=value`` into (["a", "b"], parsed YAML scalar/list)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. ppo.lr=0.001")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"{key.strip()}: cannot parse value {raw!r}") from None
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of the raw config mapping with dotted overrides applied."""
    out: dict[str, Any] = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def overlay_overrides(path: Path) -> list[str]:
    """A YAML overlay (sections of an experiment file, e.g. what ``srl tune`` writes) as dotted overrides."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read overlay ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: an overlay is a mapping of sections, like an experiment file")
    out: list[str] = []

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            out.append(f"{prefix}={json.dumps(node)}")

    walk("", data)
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML experiment file (or defaults when ``path`` is None) and apply overrides."""
    data: Any = {}
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: {yaml_problem(exc)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
    return config_from(data, overrides)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where a YAML file went wrong and why, for a one-line error: ``line 3, column 1: a tab character; ...``.

    A tab is the usual culprit in a hand-edited file, and PyYAML's words for it ("found character '\\t' that
    cannot start any token") do not say that YAML wants spaces, so it gets its own.
    """
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None)
    if problem is not None and "'\\t'" in problem:
        return f"{where}a tab character; YAML indents with spaces"
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if problem and context else problem or " ".join(str(exc).split())
    return f"{where}invalid YAML: {detail}"


class ConfigNotice(UserWarning):
    """What reading a config changed on its own and the user should hear of (``srl train`` and ``srl.train``
    print each one as a warning of the run, and keep it in ``summary.json``)."""


def config_from(data: Mapping[str, Any], overrides: list[str] | None = None) -> ExperimentConfig:
    """An experiment from a mapping shaped like an experiment file, with overrides applied."""
    merged = apply_overrides(dict(data), overrides or [])
    return build(ExperimentConfig, resolve_per_node(_target_for_env(data, merged, overrides or [])))


def _target_for_env(data: Mapping[str, Any], merged: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Drop a ``run.target_return`` written for another env: an override that changes ``env.id`` without setting
    the target would keep one that the new env's untrained policy may meet (a "solved" run that learned nothing)
    or never reach (a run that cannot stop). Said as a :class:`ConfigNotice`."""
    before, after = _dig(data, "env", "id"), _dig(merged, "env", "id")
    target = _dig(merged, "run", "target_return")
    touched = any(parse_override(o)[0] in (["run"], ["run", "target_return"]) for o in overrides)
    if before == after or target is None or touched:
        return merged
    merged["run"] = {**merged["run"], "target_return": None}
    warnings.warn(
        ConfigNotice(
            f"run.target_return: dropped: {target} was set for {before or 'the default env'}, and env.id is now "
            f"{after}; set run.target_return too to stop at a return"
        ),
        stacklevel=3,
    )
    return merged


@contextlib.contextmanager
def notices() -> Iterator[list[str]]:
    """Inside, each :class:`ConfigNotice` raised while reading a config is kept in the yielded list instead of
    printed (other warnings show as usual), for the run to give as its own warnings."""
    kept: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigNotice)
        try:
            yield kept
        finally:  # also when reading failed: the other warnings are shown all the same
            others = [w for w in caught if not issubclass(w.category, ConfigNotice)]
            kept.extend(str(w.message) for w in caught if issubclass(w.category, ConfigNotice))
    for w in others:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


def _dig(data: Mapping[str, Any], *keys: str) -> Any:
    """``data[k1][k2]...``, or None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)  # type: ignore[assignment]
    return data


def resolve_per_node(data: dict[str, Any]) -> dict[str, Any]:
    """Under ``runtime: ray``, turn per-node counts into the totals every worker reads.

    ``ray.actors_per_node`` and ``ray.policy_workers_per_node`` (when given) set ``workers.actors`` and
    ``workers.policy_workers``; a hierarchical parameter service gets one relay group per actor node. The
    saved ``config.yaml`` holds both, consistent, so it loads back to the same experiment.
    """
    ray = data.get("ray") or {}
    if data.get("runtime") != "ray" or not isinstance(ray, dict):
        return data
    out = _deep_copy(data)
    nodes = ray.get("actor_nodes", 1)
    if not isinstance(nodes, int) or isinstance(nodes, bool):
        return out  # the typed build reports the bad value
    workers = out.setdefault("workers", {})
    for key, total, least in (("actors_per_node", "actors", 1), ("policy_workers_per_node", "policy_workers", 0)):
        per_node = ray.get(key)
        valid = isinstance(per_node, int) and not isinstance(per_node, bool) and per_node >= least
        if valid and isinstance(per_node, int) and isinstance(workers, dict):  # an invalid one: RayConfig names it
            workers[total] = nodes * per_node
    params = out.setdefault("params", {})
    if isinstance(params, dict) and params.get("mode", "hierarchical") == "hierarchical":
        params["groups"] = nodes
    return out
