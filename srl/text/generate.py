"""Batched sampling from a causal LM with a KV cache, and the log-probs of completions by one full forward pass.

Prompts arrive left-padded ``[N, P]`` (pad where ``prompt_mask`` is 0), so every prompt ends at column P-1
and the first new token of every row is predicted at the same column. Position ids count real tokens only
(``cumsum(mask) - 1``), so a left-padded prompt is seen exactly as it would be alone.

Completions leave ``[N, C]``: the sampled tokens up to and including the end-of-sequence token (or the token
that completed a stop string), then pad; ``logp`` holds each sampled token's log-probability under the
temperature-scaled distribution (0 after the end), which is what the trainer recomputes with
:func:`completion_logp`. Top-p truncates the distribution tokens are *drawn* from, but the log-probs refer to
the whole temperature-scaled distribution, as in TRL and OpenRLHF, so the trainer's ratio needs no knowledge
of the truncation.

Why our own loop rather than ``model.generate``: the loop must return per-token log-probs of the exact
distribution it sampled from, take a ``torch.Generator`` (reproducible under the inline runtime), and check
stop strings on the tokens it made; ``generate`` gives processed scores and a global RNG. The measured cost
of the loop against ``model.generate`` on the same batch is in ``docs/benchmarks.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class Completions:
    """What one generation call made: ``tokens`` and ``logp`` ``[N, C]`` and ``lengths`` ``[N]`` (tokens up to
    and including the end of each completion; C when it ran out of budget)."""

    tokens: Tensor
    logp: Tensor
    lengths: Tensor


def positions(mask: Tensor) -> Tensor:
    """Position ids of a left-padded batch: 0 at each row's first real token (pads get 0 too; they are masked)."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


class StopStrings:
    """Ends a completion once its decoded text contains one of ``stop`` (checked on the newest tokens only: a
    stop string ends in the token just made, or it would have been found a step earlier)."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        # A stop string spans at most one token per byte of it; one more covers a token that straddles its start.
        self.window = max((len(s.encode()) for s in self.stop), default=0) + 1

    def __bool__(self) -> bool:
        return bool(self.stop)

    def __call__(self, tokens: Tensor, rows: Tensor) -> Tensor:
        """Which of ``rows`` (indices) now end, given the tokens made so far ``[N, i]``."""
        tail = tokens[rows, -self.window :].tolist()
        texts = self.tokenizer.batch_decode(tail, skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], dtype=torch.bool)


def _sample(logits: Tensor, top_p: float, generator: torch.Generator | None) -> Tensor:
    """One token per row from ``softmax(logits)``, restricted to the smallest set of tokens whose probability
    reaches ``top_p`` (nucleus sampling) when ``top_p < 1``."""
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability mass ranked above each token
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        pick = torch.multinomial(sorted_probs, 1, generator=generator)
        return order.gather(1, pick).squeeze(1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    max_new_tokens: int,
    *,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    stop: StopStrings | None = None,
    generator: torch.Generator | None = None,
    vocab: int | None = None,
) -> Completions:
    """Sample up to ``max_new_tokens`` tokens for each left-padded prompt, one forward pass per new token over
    the KV cache. ``greedy`` takes the most likely token (log-probs then at temperature 1). ``vocab``: sample
    among the first ``vocab`` ids only (a model whose embedding table is padded past its tokenizer's)."""
    N = prompt_ids.shape[0]
    device = prompt_ids.device
    mask = prompt_mask.long()
    pos = positions(mask)
    out = model(input_ids=prompt_ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache, logits = out.cache, out.logits[:, -1]
    next_pos = pos[:, -1] + 1
    tokens = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logp = torch.zeros((N, max_new_tokens), dtype=torch.float32, device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    lengths = torch.full((N,), max_new_tokens, dtype=torch.long, device=device)
    scale = 1.0 if greedy or temperature <= 0 else temperature
    ones = torch.ones((N, 1), dtype=mask.dtype, device=device)
    for i in range(max_new_tokens):
        scaled = logits[:, :vocab].float() / scale
        token = scaled.argmax(dim=-1) if greedy else _sample(scaled, top_p, generator)
        token_logp = torch.log_softmax(scaled, dim=-1).gather(1, token[:, None]).squeeze(1)
        live = ~done
        tokens[:, i] = torch.where(live, token, pad_id)
        logp[:, i] = torch.where(live, token_logp, 0.0)
        ending = live & (token == eos_id)
        if stop:
            rows = torch.nonzero(live & ~ending).squeeze(1)
            if len(rows):
                ending[rows] |= stop(tokens[:, : i + 1], rows).to(device)
        lengths = torch.where(ending, i + 1, lengths)
        done |= ending
        if bool(done.all()) or i == max_new_tokens - 1:
            break
        mask = torch.cat([mask, ones], dim=1)
        out = model(
            input_ids=tokens[:, i : i + 1],
            attention_mask=mask,
            position_ids=next_pos[:, None],
            cache=cache,
            use_cache=True,
        )
        cache, logits = out.cache, out.logits[:, -1]
        next_pos = next_pos + 1
    return Completions(tokens, logp, lengths)


def completion_inputs(
    prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Prompt and completion as one sequence: ``input_ids``, ``attention_mask`` and ``position_ids``
    ``[N, P + C]`` (the completion's pads after its end are masked)."""
    ids = torch.cat([prompt_ids, tokens], dim=1)
    attn = torch.cat([prompt_mask.long(), mask.long()], dim=1)
    return ids, attn, positions(attn)


def completion_logits(
    model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor, hidden: bool = False
) -> tuple[Tensor, Tensor | None]:
    """One forward pass over prompt + completion: the logits ``[N, C, V]`` that predicted each completion token
    (the last prompt column predicts the first), and with ``hidden`` the last layer's states at those columns
    ``[N, C, D]`` (what a value head reads)."""
    ids, attn, pos = completion_inputs(prompt_ids, prompt_mask, tokens, mask)
    P, C = prompt_ids.shape[1], tokens.shape[1]
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=hidden)
    states = out.hidden_states[-1][:, P - 1 : P + C - 1] if hidden else None
    return out.logits[:, P - 1 : P + C - 1], states


def token_logp(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0, vocab: int | None = None
) -> tuple[Tensor, Tensor]:
    """Log-probs of ``tokens`` ``[N, C]`` under ``logits / temperature`` ``[N, C, V]`` (the first ``vocab``
    ids), and the distribution's entropy per position."""
    logprobs = torch.log_softmax(logits[..., :vocab].float() / temperature, dim=-1)
    chosen = logprobs.gather(2, tokens[..., None]).squeeze(2)
    entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    return chosen, entropy


@torch.no_grad()
def completion_logp(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    tokens: Tensor,
    mask: Tensor,
    temperature: float = 1.0,
    vocab: int | None = None,
) -> Tensor:
    """Each completion token's log-prob ``[N, C]`` under ``model`` by one full forward pass (0 after the end)."""
    logits, _ = completion_logits(model, prompt_ids, prompt_mask, tokens, mask)
    return token_logp(logits, tokens, temperature, vocab)[0] * mask
