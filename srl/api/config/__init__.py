"""Experiment configuration: typed, frozen dataclasses, one docstring per field.

An experiment is one YAML file (see ``configs/``) mapped onto
:class:`ExperimentConfig`. Command-line overrides use dotted keys
(``--set ppo.lr=0.001``). Everything is validated when it is built: a wrong
key, type or value raises :class:`ConfigError` whose message names the field,
so the CLI can print one line and exit non-zero. Configs are never mutated
after parsing; derive a new one with :func:`dataclasses.replace` instead.

One module per section (``env``, ``workers``, ``model``, ``ppo``, ``dqn``, ``r2d2`` and ``qmix``, ``sac`` and ``td3``,
``alphazero`` and ``muzero`` with their ``search`` and ``reanalyze`` (in ``search``), ``params``, ``stage``,
``league``, ``replay``, ``text``, ``ray``, ``run``, ``cost``), the root in ``experiment``, typed building in
``parse`` and the YAML / ``--set`` reading in ``load``; every public name is imported from this package.
"""

from __future__ import annotations

from srl.api.config.cost import CostConfig
from srl.api.config.dqn import DQNConfig, QMixConfig, R2D2Config
from srl.api.config.env import EnvConfig
from srl.api.config.errors import ConfigError
from srl.api.config.experiment import FIXED_ON_RESUME, ExperimentConfig
from srl.api.config.league import Bot, LeagueConfig
from srl.api.config.load import (
    ConfigNotice,
    apply_overrides,
    config_from,
    load_config,
    notices,
    parse_override,
    resolve_per_node,
)
from srl.api.config.model import ModelConfig
from srl.api.config.params import ParamsConfig
from srl.api.config.parse import build, to_dict
from srl.api.config.ppo import PPOConfig
from srl.api.config.ray import RayConfig
from srl.api.config.replay import ReplayConfig
from srl.api.config.run import RunConfig
from srl.api.config.sac import SACConfig, TD3Config
from srl.api.config.search import AlphaZeroConfig, MuZeroConfig, ReanalyzeConfig, SearchConfig
from srl.api.config.stage import StageConfig
from srl.api.config.text import TextConfig
from srl.api.config.workers import WorkersConfig

__all__ = [
    "FIXED_ON_RESUME",
    "AlphaZeroConfig",
    "Bot",
    "ConfigError",
    "ConfigNotice",
    "CostConfig",
    "DQNConfig",
    "EnvConfig",
    "ExperimentConfig",
    "LeagueConfig",
    "ModelConfig",
    "MuZeroConfig",
    "PPOConfig",
    "ParamsConfig",
    "QMixConfig",
    "R2D2Config",
    "RayConfig",
    "ReanalyzeConfig",
    "ReplayConfig",
    "RunConfig",
    "SACConfig",
    "SearchConfig",
    "StageConfig",
    "TD3Config",
    "TextConfig",
    "WorkersConfig",
    "apply_overrides",
    "build",
    "config_from",
    "load_config",
    "notices",
    "parse_override",
    "resolve_per_node",
    "to_dict",
]
