"""The ``model`` section: the shape of the policy (actor) and value (critic) networks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from srl.api.config.errors import check


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Network shape, shared by the policy (actor) and value (critic) networks."""

    encoder: str = "default"
    """The observation encoder of both networks: ``default`` (one encoder per observation part: the Nature CNN for
    images, normalized vectors, one-hot codes for discrete parts, then an MLP of ``hidden``), or
    ``package.module:Encoder``, built as ``Encoder(obs_space, model)``: an ``nn.Module`` with an int ``out_dim``
    mapping the observation parts to features ``[N, out_dim]`` (see ``examples/custom_network.py``)."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the MLPs."""
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    """Hidden activation."""
    layer_norm: bool = False
    """LayerNorm after each hidden linear layer."""
    normalize_obs: bool = True
    """Running mean/std observation normalization inside the networks (its statistics ship with the parameters)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions; state-independent, learned)."""
    plane_convs: tuple[int, ...] = ()
    """Channels of 3x3 same-padded ReLU convolutions run over each float observation part shaped ``[C, H, W]``
    (a board game's planes; uint8 images get the Nature CNN) before the MLP. Empty: such parts are flattened.
    The convolutions see a threat wherever on the board it is, which a flat MLP must learn square by square."""
    cnn_dtype: Literal["float32", "bfloat16"] = "float32"
    """What the Nature CNN computes in. ``bfloat16``: its convolutions and linear layer run under autocast, in
    inference and in the update alike (so behaviour and trainer log-probs come from the same arithmetic); the
    weights, their gradients, the optimizer and everything after the CNN stay float32. On CPUs with bfloat16
    matrix units (Intel AMX: Sapphire Rapids and later) the CNN's forward+backward ran 2.2x faster on one thread
    and Pong's whole update 1.5x; on CPUs without them it is slower, so it is a switch, off by default (see
    docs/benchmarks.md, "The CNN in bfloat16")."""
    shared_encoder: bool = False
    """The critic's head sits on the actor's encoder (one CNN/MLP torso for both) instead of its own copy.

    Halves the update cost where the encoder dominates it (the Nature CNN on Atari). The critic head
    still never leaves the trainer; the value loss then also shapes the actor's features.
    """

    core: Literal["none", "lstm", "gru"] = "none"
    """A recurrent core between the encoder and the heads: the policy then has memory (its state travels with
    each inference request and each segment; see :mod:`srl.nets.memory`). With ``shared_encoder`` the critic's
    head reads the actor's core; otherwise the critic has a core of its own, unrolled over each segment from a
    zero state (it never acts, so no state of it is kept between segments: ``ppo.burn_in`` warms it up)."""
    core_size: int = 128
    """Units of the recurrent core (its state is twice that for an LSTM: h and c)."""

    def __post_init__(self) -> None:
        check(self.core_size >= 1, "core_size", f"must be >= 1, got {self.core_size}")
        check(all(c >= 1 for c in self.plane_convs), "plane_convs", f"must be positive, got {list(self.plane_convs)}")
        check(
            len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden),
            "hidden",
            f"must be a non-empty list of positive widths, got {list(self.hidden)}",
        )
