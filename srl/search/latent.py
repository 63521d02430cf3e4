"""A learned model as a search's model (MuZero): the trees grow in the model's latent states, not in the env.

Every tree of a batch takes one simulation at a time with the others (:class:`srl.search.tree.Trees`), so each
simulation is one pass of the dynamics and prediction networks over the new node of every tree. A node's latent
state is a row of one preallocated tensor ``[B, simulations + 1, latent]`` indexed as the trees number their nodes;
a child is the dynamics of its parent's row and the edge's action. The env is one player's: every edge is
discounted by ``gamma`` and no latent state is terminal. Only the root knows the env's legal actions (its
observation's mask, where it has one); below it every action is open.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from srl.api.config.search import SearchConfig
from srl.search.tree import Searched, Trees


class LatentModel(Protocol):
    """What a search needs of a learned model: scalar rewards and values, in the env's units."""

    def initial(self, obs: Mapping[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Observations -> their latent states ``[B, H]``, policy logits ``[B, A]`` and values ``[B]``."""

    def recurrent(self, latent: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Latent states and actions ``[B]`` -> the next latent states, the rewards of the moves ``[B]``, and
        the next states' logits and values."""


class LatentSearch:
    """Searches a batch of observations in a model's latent space; trees and latent rows are kept for the next
    batch of the same size."""

    def __init__(self, settings: SearchConfig, actions: int, gamma: float) -> None:
        self.settings, self.actions, self.gamma = settings, actions, gamma
        self._trees: Trees | None = None
        self._latents: Tensor | None = None

    @torch.no_grad()
    def __call__(
        self,
        model: LatentModel,
        obs: Mapping[str, Tensor],
        legal: np.ndarray | None,
        rng: np.random.Generator | None,
    ) -> Searched:
        """Search every row of ``obs`` (parts ``[B, ...]`` on the model's device); ``legal`` ``[B, A]`` the root's
        legal actions (None: all); ``rng`` the Gumbel draws (or Dirichlet noise), None for a deterministic search."""
        latent, logits, values = model.initial(obs)
        b, a = latent.shape[0], self.actions
        if self._trees is None or self._trees.batch != b:
            self._trees = Trees(b, a, self.settings)
            self._latents = None
        if self._latents is None or self._latents.shape[2] != latent.shape[1] or self._latents.device != latent.device:
            self._latents = torch.zeros((b, self.settings.simulations + 1, latent.shape[1]), device=latent.device)
        trees, latents = self._trees, self._latents
        rows = torch.arange(b, device=latent.device)
        everything = np.ones((b, a), bool)  # below the root every action is open
        root_legal = everything if legal is None else np.asarray(legal, bool)
        trees.reset(logits.cpu().numpy(), values.cpu().numpy(), root_legal, rng)
        latents[:, 0] = latent
        discounts, terminal = np.full(b, self.gamma), np.zeros(b, bool)
        for _ in range(trees.simulations):
            parents, actions = trees.select()  # no latent state is terminal: every tree expands one
            parent_rows = latents[rows, torch.from_numpy(parents).to(latent.device)]
            child, rewards, logits, values = model.recurrent(parent_rows, torch.from_numpy(actions).to(latent.device))
            latents[:, trees.new_node] = child
            trees.expand(
                logits.cpu().numpy(), values.cpu().numpy(), everything, rewards.cpu().numpy(), discounts, terminal
            )
        return Searched(trees.root_action(), trees.policy(), trees.root_value(), np.ones(b, bool))
