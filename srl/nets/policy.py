"""Actor and critic networks, kept in separate modules.

SRL's decentralized critic means policy workers only ever hold the actor: the
parameter service ships ``PolicyNet.flat_state()`` and nothing else, and each
trainer keeps its own ``ValueNet``. Splitting the classes (rather than one
actor-critic module with two heads) makes that boundary impossible to blur.

Both read observations as parts (``{"obs": ...}`` or ``{"obs.<key>": ...}``,
see :mod:`srl.api.spaces`) through an :class:`ObsEncoder`; the actor samples
through a head of :mod:`srl.nets.distributions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from srl.api.config import ModelConfig
from srl.api.spaces import ACTION_MASK, GAME_HISTORY, OBS, ObsPart, action_spec, mask_part, obs_parts
from srl.nets.cnn import NatureCNN
from srl.nets.distributions import ActionHead, make_action_head, mask_logits, masked_categorical_evaluate
from srl.nets.flat import FlatState
from srl.nets.memory import Recurrent
from srl.nets.mlp import init_linear, mlp
from srl.nets.normalizer import RunningMeanStd

__all__ = ["Flattened", "ObsEncoder", "PolicyNet", "ValueNet"]


def _run_layers(layers: Sequence[nn.Module], x: Tensor) -> Tensor:
    """Apply layers in order, calling ``forward`` directly.

    Skipping ``nn.Module.__call__`` (hook dispatch) measurably cuts small-batch
    inference latency, where per-call Python overhead dominates the FLOPs.
    The price: module hooks on these layers do not fire.
    """
    for layer in layers:
        x = layer.forward(x)
    return x


class ObsEncoder(nn.Module):
    """Observation parts -> one feature vector ``[N, out_dim]``.

    Each part is encoded by its kind: ``[C, H, W]`` uint8 images by a
    :class:`NatureCNN` (which scales pixels by 1/255 itself), vectors by a
    running normalizer (with ``normalize_obs``) and a flatten, Discrete and
    MultiDiscrete parts as one-hot codes, MultiBinary parts as 0/1 floats.
    The features are concatenated and go through the MLP torso (``hidden``,
    ``activation``, ``layer_norm``); an observation made of images only skips
    the torso (the head sits on the CNN's 512 features). Shared by actor and
    critic as a *class*, never as an instance: each net owns its own weights
    and statistics.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        hidden: Sequence[int],
        activation: str,
        layer_norm: bool,
        normalize_obs: bool,
        root: str = OBS,
        plane_convs: Sequence[int] = (),
        cnn_dtype: str = "float32",
    ) -> None:
        """``root``: the field names of the parts (``obs...``; ``state...`` for a global state); ``plane_convs``:
        the channels of the convolutions over float ``[C, H, W]`` parts (``model.plane_convs``); ``cnn_dtype``:
        what the Nature CNN of image parts computes in (``model.cnn_dtype``)."""
        super().__init__()
        # an action mask is not a feature: it only masks the actor's logits (PolicyNet); a game's history is what
        # a search rebuilds the game from
        self.parts: tuple[ObsPart, ...] = tuple(
            p for p in obs_parts(obs_space, root) if p.name not in (ACTION_MASK, GAME_HISTORY)
        )
        self.normalizers = nn.ModuleDict()
        self.cnns = nn.ModuleDict()
        self._codes: dict[str, tuple[Tensor, int]] = {}  # part -> (one-hot offsets, width)
        dim = 0
        for p in self.parts:
            key = _key(p.name)
            if p.kind == "image":
                cnn = NatureCNN(p.shape, cnn_dtype)  # type: ignore[arg-type]
                self.cnns[key] = cnn
                dim += cnn.out_dim
            elif p.kind in ("discrete", "multi_discrete"):
                offsets = torch.tensor(np.cumsum((0, *p.nvec[:-1])) - np.asarray(p.start), dtype=torch.long)
                self._codes[p.name] = (offsets, sum(p.nvec))
                dim += sum(p.nvec)
            else:
                if p.kind == "vector" and normalize_obs:
                    self.normalizers[key] = RunningMeanStd(p.shape)
                if p.kind == "vector" and len(p.shape) == 3 and plane_convs:
                    self.cnns[key] = _plane_convs(int(p.shape[0]), plane_convs)
                    dim += int(plane_convs[-1]) * int(p.shape[1]) * int(p.shape[2])
                else:
                    dim += int(np.prod(p.shape)) if p.shape else 1
        images_only = all(p.kind == "image" for p in self.parts)
        self.torso: nn.Module = nn.Identity() if images_only else mlp(dim, hidden, activation, layer_norm)
        self.out_dim: int = dim if images_only or not len(hidden) else int(hidden[-1])
        # Plain tuple (not a registered container) so the hot path avoids nn.Module attribute lookup; the
        # layers are still owned by ``torso``.
        self._layers: tuple[nn.Module, ...] = () if images_only else tuple(self.torso)  # type: ignore[arg-type]
        self._plain = len(self.parts) == 1 and self.parts[0].kind == "vector" and not len(self.cnns)
        key = _key(self.parts[0].name)
        rms = self.normalizers[key] if self._plain and key in self.normalizers else None
        self._plain_rms = rms if isinstance(rms, RunningMeanStd) else None  # the fast path's one normalizer

    @staticmethod
    def from_model(obs_space: spaces.Space, model: ModelConfig) -> ObsEncoder:
        """The built-in encoder shaped by a ``model`` section: what ``model.encoder: default`` names."""
        return ObsEncoder._from(obs_space, model, model.hidden)

    @staticmethod
    def features_from_model(obs_space: spaces.Space, model: ModelConfig) -> ObsEncoder:
        """The same without its torso: the parts' features joined, for a network that adds an input of its own
        (a critic of an action) before its MLP."""
        return ObsEncoder._from(obs_space, model, ())

    @staticmethod
    def _from(obs_space: spaces.Space, model: ModelConfig, hidden: Sequence[int]) -> ObsEncoder:
        return ObsEncoder(
            obs_space,
            hidden,
            model.activation,
            model.layer_norm,
            model.normalize_obs,
            plane_convs=model.plane_convs,
            cnn_dtype=model.cnn_dtype,
        )

    @property
    def obs_normalizer(self) -> RunningMeanStd | None:
        """The normalizer of an observation made of one vector part (None otherwise, or when disabled)."""
        return self._plain_rms

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Parts ``{name: [N, *shape]}`` (any real dtype) -> features ``[N, out_dim]``."""
        if self._plain:  # the common case, kept short: one vector
            x = obs[self.parts[0].name]
            if x.dtype != torch.float32:
                x = x.float()
            rms = self.obs_normalizer
            if rms is not None:
                x = rms.normalize(x)
            return _run_layers(self._layers, x.reshape(x.shape[0], -1))
        features = [self._part(p, obs[p.name]) for p in self.parts]
        x = features[0] if len(features) == 1 else torch.cat(features, dim=1)
        return _run_layers(self._layers, x)

    def _part(self, p: ObsPart, x: Tensor) -> Tensor:
        key = _key(p.name)
        if p.kind == "image":  # the CNN converts and scales its uint8 input itself
            cnn: NatureCNN = self.cnns[key]  # type: ignore[assignment]  # ModuleDict items are typed Module
            return cnn(x)
        if p.name in self._codes:
            offsets, width = self._codes[p.name]
            index = x.long().reshape(x.shape[0], -1) + offsets.to(x.device)
            return torch.zeros(x.shape[0], width, device=x.device).scatter_(1, index, 1.0)
        x = x.float()
        if key in self.normalizers:
            rms: RunningMeanStd = self.normalizers[key]  # type: ignore[assignment]
            x = rms.normalize(x)
        if key in self.cnns:  # planes of a board
            x = self.cnns[key](x)
        return x.reshape(x.shape[0], -1)

    def normalizer_inputs(self, obs: Mapping[str, Tensor]) -> list[tuple[RunningMeanStd, Tensor]]:
        """Each running normalizer with the batch of its part (to fold in after an update)."""
        return [(self.normalizers[_key(p.name)], obs[p.name]) for p in self.parts if _key(p.name) in self.normalizers]  # type: ignore[misc]


def _plane_convs(channels: int, widths: Sequence[int]) -> nn.Sequential:
    """3x3 same-padded ReLU convolutions over ``[N, channels, H, W]`` planes (the board keeps its size)."""
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Conv2d(channels, int(width), 3, padding=1), nn.ReLU()]
        channels = int(width)
    return nn.Sequential(*layers)


def _key(name: str) -> str:
    """A part name as a module key (``nn.Module`` names may not contain dots)."""
    return name.replace(".", "/")


def _state_tensors(module: nn.Module) -> list[Tensor]:
    """Parameters then buffers, in registration order (identical across same-config nets).

    Fetched on every call rather than cached: ``module.to(device)`` replaces
    buffer objects, so cached references would silently go stale.
    """
    return list(module.parameters()) + list(module.buffers())


class Flattened(nn.Module):
    """A module whose parameters and buffers travel as one flat float32 vector."""

    _flat: FlatState

    def _init_flat(self) -> None:
        """Call last in ``__init__``, once every submodule is registered."""
        self._flat = FlatState(_state_tensors(self))

    def flat_size(self) -> int:
        """Length of the vector produced by :meth:`flat_state`."""
        return self._flat.size

    def flat_state(self, out: np.ndarray | None = None) -> np.ndarray:
        """All parameters and buffers as one float32 1-D array (what gets shipped).

        Pass ``out`` (e.g. a shared-memory view) to write without allocating.
        The float64 normalizer ``count`` is rounded to float32 here; it only
        matters for further updates, which policy workers never do.
        """
        return self._flat.pack(_state_tensors(self), out)

    def load_flat_state(self, flat: np.ndarray) -> None:
        """Overwrite parameters and buffers in place from :meth:`flat_state` output.

        Raises ValueError naming expected and actual length on a mismatch.
        """
        self._flat.unpack(_state_tensors(self), flat)


class PolicyNet(Flattened):
    """The actor: observation -> action distribution (see :mod:`srl.nets.distributions`).

    Discrete and MultiDiscrete actions are indices ``0..n-1`` (a ``start`` offset is the env adapter's job), Box
    actions are returned unclipped, flattened to ``[N, act_dim]`` (clipping to bounds also belongs to the env
    adapter, so log-probs always refer to the action actually sampled), MultiBinary actions are int8 0/1.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        layer_norm: bool = False,
        normalize_obs: bool = True,
        init_log_std: float = 0.0,
        encoder: nn.Module | None = None,
    ) -> None:
        """``encoder``: a plugin encoder (an ``nn.Module`` with ``out_dim``) instead of an :class:`ObsEncoder`."""
        super().__init__()
        # A plugin encoder offers what the heads use of an ObsEncoder: ``out_dim`` and ``forward``.
        self.encoder: ObsEncoder = (
            encoder  # type: ignore[assignment]
            if encoder is not None
            else ObsEncoder(obs_space, hidden, activation, layer_norm, normalize_obs)
        )
        self.action = action_spec(action_space)
        mask = mask_part(obs_parts(obs_space), self.action)
        self.mask: str | None = None if mask is None else mask.name
        """The observation part that holds legal actions (:data:`~srl.api.spaces.ACTION_MASK`), or None."""
        self.dist: ActionHead = make_action_head(self.action, init_log_std)  # a Module (registered) when it learns
        self.head: nn.Linear = init_linear(nn.Linear(self.encoder.out_dim, self.dist.out_dim), 0.01)
        self._init_flat()

    @property
    def obs_normalizer(self) -> RunningMeanStd | None:
        """The actor's normalizer of a plain vector observation (or None), shipped inside ``flat_state``."""
        return getattr(self.encoder, "obs_normalizer", None)

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Raw head output ``[N, out_dim]``: logits (illegal actions at -inf when the observation has a mask), or
        action means (Box)."""
        out = self.head.forward(self.encoder.forward(obs))
        return out if self.mask is None else mask_logits(out, obs[self.mask])

    def legal(self, obs: Mapping[str, Tensor], rows: int | None = None) -> Tensor | None:
        """The legal-action mask of the first ``rows`` observations (all by default), or None without one."""
        if self.mask is None:
            return None
        return obs[self.mask] if rows is None else obs[self.mask][:rows]

    @torch.no_grad()
    def act(self, obs: Mapping[str, Tensor], deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """Sample actions and their log-probs for inference (no autograd); log-probs float32 ``[N]``."""
        return self.dist.act(self.forward(obs), deterministic)

    @property
    def memory_size(self) -> int:
        """Floats of recurrent state per environment (0: a feed-forward policy)."""
        return int(getattr(self.encoder, "state_size", 0))

    @torch.no_grad()
    def act_with_memory(
        self, obs: Mapping[str, Tensor], state: Tensor, deterministic: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`act` for a policy with memory: each environment's state ``[N, memory_size]`` in, actions,
        log-probs and the next states out."""
        core: Recurrent = self.encoder  # type: ignore[assignment]  # memory_size > 0: the encoder has a core
        features, after = core.step(obs, state)
        out = self.head.forward(features)
        if self.mask is not None:
            out = mask_logits(out, obs[self.mask])
        actions, logp = self.dist.act(out, deterministic)
        return actions, logp, after

    def evaluate(self, obs: Mapping[str, Tensor], actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probs ``[N]`` and entropies ``[N]`` of given actions, with gradients (training)."""
        return self.evaluate_features(self.encoder.forward(obs), actions, self.legal(obs))

    def evaluate_features(
        self, features: Tensor, actions: Tensor, legal: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """:meth:`evaluate` from encoder features already computed (shared with a critic head); ``legal``: the
        rows' action mask (:meth:`legal`) when the observation has one."""
        out = self.head.forward(features)
        if legal is None:
            return self.dist.evaluate(out, actions)
        return masked_categorical_evaluate(mask_logits(out, legal), actions.reshape(-1))


class ValueNet(Flattened):
    """The critic: observation -> scalar value. Leaves its trainer only with a centralized critic.

    By default it owns its encoder. Given ``shared_encoder`` (the actor's), it
    owns only its head and reads the actor's features: the encoder is then
    held outside the module tree, so this module's parameters, state dict and
    normalizer updates stay the head's alone and nothing is counted twice.
    With ``normalize_values`` the head predicts standardized returns and
    ``return_normalizer`` (a buffer module, checkpointed and shipped with the
    weights) holds the statistics; :meth:`forward` always answers in return units.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        layer_norm: bool = False,
        normalize_obs: bool = True,
        shared_encoder: nn.Module | None = None,
        normalize_values: bool = False,
        encoder: nn.Module | None = None,
        root: str = OBS,
    ) -> None:
        """``encoder``: a plugin encoder of its own (an ``nn.Module`` with ``out_dim``) instead of an
        :class:`ObsEncoder`; ignored when ``shared_encoder`` is given. ``root``: the field names its built-in
        encoder reads (``obs...``, or ``state...`` for a critic on the global state)."""
        super().__init__()
        self.shared: bool = shared_encoder is not None
        self._encoder: tuple[ObsEncoder, ...]  # plain tuple: not registered when shared
        if shared_encoder is None:
            self.own_encoder = (
                encoder
                if encoder is not None
                else ObsEncoder(obs_space, hidden, activation, layer_norm, normalize_obs, root)
            )
            self._encoder = (self.own_encoder,)  # type: ignore[assignment]  # a plugin encoder: out_dim, forward
        else:
            self._encoder = (shared_encoder,)  # type: ignore[assignment]
        self.head: nn.Linear = init_linear(nn.Linear(self.encoder.out_dim, 1), 1.0)
        self.return_normalizer: RunningMeanStd | None = RunningMeanStd(()) if normalize_values else None
        self._init_flat()

    @property
    def encoder(self) -> ObsEncoder:
        """The encoder the head reads: its own, or the actor's when shared."""
        return self._encoder[0]

    @property
    def obs_normalizer(self) -> RunningMeanStd | None:
        """The critic's normalizer (or None): its own, or the actor's when the encoder is shared."""
        return getattr(self.encoder, "obs_normalizer", None)

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        """Values ``[N]`` in return units."""
        return self.denormalize(self.head_output(self.encoder.forward(obs)))

    def head_output(self, features: Tensor) -> Tensor:
        """The head's raw output ``[N]`` from encoder features: standardized when values are normalized."""
        return self.head.forward(features).squeeze(-1)

    def normalize(self, values: Tensor) -> Tensor:
        """Return units -> the head's scale (identity without value normalization)."""
        rn = self.return_normalizer
        return values if rn is None else (values - rn.mean) * torch.rsqrt(rn.var + 1e-8)

    def denormalize(self, out: Tensor) -> Tensor:
        """The head's scale -> return units (identity without value normalization)."""
        rn = self.return_normalizer
        return out if rn is None else rn.denormalize(out)
