"""R2D2 (Kapturowski et al. 2019) as an :class:`~srl.api.worker.Algorithm`: DQN with a recurrent Q network,
learning from stored sequences.

The actors act with the recurrent Q network (``model.core``: an LSTM or a GRU), each environment carrying its
state, and their segments keep that state at every step (:data:`~srl.api.schema.MEMORY`). The replay hands the
trainer *sequences* of ``replay.item_length`` steps, each with the state its first step was acted on with
(:meth:`srl.replay.spec.ReplaySpec.batch_fields`), starting every ``replay.item_stride`` steps. A learner
step, for each sequence:

1. unrolls the online network from that stored state (or from zeros: ``r2d2.stored_state: false``) over the
   sequence's observations, the state zeroed where an episode ended; the first ``burn_in`` steps only rebuild the
   state (no gradient, no loss), which repairs a stored state that older weights produced;
2. unrolls the target network over the same rows, and values each row by double Q;
3. makes n-step targets within the sequence (:func:`srl.algorithms.r2d2_math.sequence_targets`), in rescaled units
   ``h`` with ``value_rescale``;
4. trains on the steps after the burn-in, weighted by the sequence's importance weight, and hands back the
   sequence's priority ``eta max |td| + (1 - eta) mean |td|``.

Everything else is DQN's: the dueling head, Adam and the gradient clip, the target network's hard copies or
Polyak steps, and the actors' epsilon-greedy exploration (:meth:`srl.algorithms.dqn.DQN.explorer`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from srl.algorithms.dqn import DQN, require_discrete
from srl.algorithms.dqn_math import greedy_values, td_loss
from srl.algorithms.r2d2_math import sequence_priority, sequence_targets
from srl.algorithms.replay_batch import require_batch_fits
from srl.api.algorithm import Obs, PlanView
from srl.api.config import ConfigError, ExperimentConfig, R2D2Config
from srl.api.schema import MEMORY
from srl.api.worker import Priorities, TrainResult
from srl.nets.memory import Sequences, carried_rows

__all__ = ["R2D2", "require_sequences"]


def require_sequences(cfg: ExperimentConfig, section: str) -> None:
    """What a learner from stored sequences needs (R2D2, QMIX): a recurrent core, a burn-in shorter than the
    sequences, batches the replay can hold; one line naming the setting otherwise."""
    if cfg.model.core == "none":
        raise ConfigError(f"model.core: {section} learns a recurrent Q network; set model.core to lstm or gru")
    length, burn_in = cfg.replay.item_length, getattr(cfg, section).burn_in
    if burn_in >= length:
        raise ConfigError(
            f"{section}.burn_in: {burn_in} steps leave none of each sequence (replay.item_length={length}) to train "
            "on; make the burn-in shorter than the sequence"
        )
    require_batch_fits(section, getattr(cfg, section).batch_size, cfg, "sequences")


class R2D2(DQN):
    """Recurrent DQN on stored sequences: burn-in, stored or zero start states, n-step double-Q targets within
    each sequence, value rescaling and mixed max/mean sequence priorities."""

    section = "r2d2"
    settings = R2D2Config
    cfg: R2D2Config
    live_settings = DQN.live_settings | {"gamma", "eta"}
    """DQN's, and what the learner's own targets and priorities read (it makes them from the stored sequences)."""

    @staticmethod
    def check(plan: PlanView) -> None:
        """Discrete actions, a recurrent core, and sequences long enough to train on after their burn-in."""
        for policy in plan.policies:
            require_discrete(policy.action_space, plan.cfg)
        require_sequences(plan.cfg, "r2d2")

    def train(self, batch: Mapping[str, np.ndarray], progress: float) -> TrainResult:
        """One learner step on ``N`` sequences of ``L`` steps (:meth:`ReplaySpec.batch_fields`, sequences): for
        each observation part ``P`` ``[L + 1, N, ...]``; ``actions``, ``rewards``, ``terminated`` and
        ``truncated`` ``[L, N]``; :data:`MEMORY` ``[N, S]``, the state each sequence's first step was acted on
        with; ``alive [L, N]`` in a multi-agent env's batch; ``weights [N]`` and ``keys [N]``. The learning rate
        is constant: ``progress`` is not read."""
        cfg = self.cfg
        length, n = batch["actions"].shape[:2]
        obs = {name: self._rows(batch, name) for name in self.parts}  # [(L + 1) * N, ...]
        seq = self._sequences(batch)
        q_all = self.q.unroll(obs, seq, cfg.burn_in).reshape(length + 1, n, -1)
        with torch.no_grad():
            q_next = self.target.unroll(obs, seq).reshape(length + 1, n, -1)
            values = self._values(q_all.detach(), q_next, obs)
            eps = cfg.rescale_eps if cfg.value_rescale else None
            target = sequence_targets(
                batch["rewards"], batch["terminated"], batch["truncated"], values, cfg.gamma, cfg.nstep, eps
            )
        trained = slice(cfg.burn_in, length)
        actions = self._tensor(batch, "actions").long()
        q_taken = q_all[:length].gather(-1, actions.unsqueeze(-1)).squeeze(-1)[trained]  # [L - burn_in, N]
        weight = torch.ones_like(q_taken)
        if "alive" in batch:  # a step its agent did not take (it left the env) is no transition: weight 0
            weight = self._tensor(batch, "alive")[trained].float()
        weights = self._tensor(batch, "weights").float()[None, :] * weight
        loss, td = td_loss(q_taken.reshape(-1), target[trained].reshape(-1), weights.reshape(-1), cfg.loss)
        td = td.reshape(q_taken.shape) * weight
        stats = self._descend(loss)
        steps = {k: v[: length * n] for k, v in obs.items()}  # the observations the sequences' steps act on
        self._update_normalizers(
            steps if "alive" not in batch else {k: v[self._alive_rows(batch)] for k, v in steps.items()}
        )
        priorities = sequence_priority(td.abs(), weight, cfg.eta)
        stats.update(
            loss=float(loss.detach()),
            td_abs_mean=float(td.abs().mean()),
            q_mean=float(q_taken.detach().mean()),
            q_max=float(q_all.detach().max()),
            target_mean=float(target[trained].mean()),
            learner_steps=float(self.learner_steps),
        )
        return TrainResult(stats, Priorities(np.asarray(batch["keys"]), priorities.float().cpu().numpy()))

    # ------------------------------------------------------------------ internals
    def _sequences(self, batch: Mapping[str, np.ndarray]) -> Sequences:
        """How the batch's ``L + 1`` rows run: each sequence from its stored state (or zeros), the state zeroed
        before a row whose previous step ended its episode and kept through a step its column sat idle, as the
        actor carried it."""
        resets, idle = carried_rows(batch["terminated"], batch["truncated"], batch.get("alive"), self.device)
        state = self._tensor(batch, MEMORY).float()
        return Sequences(state if self.cfg.stored_state else torch.zeros_like(state), resets, idle=idle)

    def _alive_rows(self, batch: Mapping[str, np.ndarray]) -> Tensor:
        """The flat (time-major) step rows whose agent acted."""
        return self._tensor(batch, "alive").reshape(-1)

    def _values(self, q_online: Tensor, q_target: Tensor, obs: Obs) -> Tensor:
        """Each row's bootstrap value ``[L + 1, N]``: the target network's value of the best legal action, picked
        by the online network (double Q) or by the target network."""
        pick = q_online if self.cfg.double_q else q_target
        legal = self.q.legal(obs)
        return greedy_values(pick, q_target, None if legal is None else legal.reshape(pick.shape))
