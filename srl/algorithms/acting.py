"""What every acting policy shares: numpy in and out around its tensor ``act_tensors`` on its device, and, for
a policy of one network, its flat snapshot.

An algorithm's acting policy (``acting_policy(ctx)``: what actors, policy workers, evaluation and
``srl.load_policy`` run) writes only what is its own: its fields and ``act_tensors``. :class:`TensorActing`
gives it ``act`` (the arrays as tensors on its device, shared with numpy on the CPU) and :class:`NetActing` the
device move and the snapshot of its network (``load_flat``, ``flat_size``, ``flat_state``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch

Obs = Mapping[str, torch.Tensor]


def as_tensors(obs: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Observation parts as tensors sharing the arrays' memory (copied only when not contiguous)."""
    return {name: torch.from_numpy(np.ascontiguousarray(x)) for name, x in obs.items()}


def on_device(
    act: Callable[[Obs, bool], Mapping[str, torch.Tensor]],
    obs: Mapping[str, np.ndarray],
    device: torch.device,
    deterministic: bool,
) -> dict[str, np.ndarray]:
    """A device policy's numpy-in, numpy-out ``act``: the arrays moved to ``device`` (shared, not copied, on the
    CPU), ``act`` there, and its answers back as arrays."""
    tensors = {name: x.to(device) for name, x in as_tensors(obs).items()}
    return {name: x.cpu().numpy() for name, x in act(tensors, deterministic).items()}


class TensorActing:
    """A policy that acts on tensors on its device (``srl.api.worker.DevicePolicy``): ``act`` on arrays is its
    :meth:`act_tensors` there."""

    device = torch.device("cpu")
    """Where it acts (a policy worker's ``workers.policy_device`` moves it)."""

    def act_tensors(self, obs: Obs, deterministic: bool = False) -> Mapping[str, torch.Tensor]:
        """``actions`` and every declared output for a batch of observation parts on :attr:`device`."""
        raise NotImplementedError

    def act(self, obs: Mapping[str, np.ndarray], deterministic: bool = False) -> dict[str, np.ndarray]:
        return on_device(self.act_tensors, obs, self.device, deterministic)


class FlatNet(Protocol):
    """A network that ships as one flat snapshot (``srl.nets``' policies, Q networks and actors)."""

    def to(self, device: torch.device) -> Any: ...

    def load_flat_state(self, flat: np.ndarray) -> None: ...

    def flat_size(self) -> int: ...

    def flat_state(self, out: np.ndarray | None = None) -> np.ndarray: ...


class NetActing(TensorActing):
    """A :class:`TensorActing` policy of one network, :attr:`net`, whose flat state is its snapshot."""

    net: FlatNet

    def to_device(self, device: torch.device) -> None:
        """Act on ``device`` (a policy worker's ``workers.policy_device``)."""
        self.device = device
        self.net.to(device)

    def load_flat(self, flat: np.ndarray) -> None:
        self.net.load_flat_state(flat)

    def flat_size(self) -> int:
        return self.net.flat_size()

    def flat_state(self) -> np.ndarray:
        return self.net.flat_state()
