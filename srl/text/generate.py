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


def trim_padding(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Left-padded prompts without their leading columns that are padding in every row: the same numbers (those
    columns are masked everywhere, and positions count real tokens only), fewer columns to attend over. A task's
    prompts arrive padded to its ``max_prompt_tokens``; a batch's longest prompt is often shorter."""
    real = prompt_mask.bool().any(dim=0).nonzero()
    first = int(real[0]) if len(real) else 0  # no real token anywhere: nothing to go by, nothing trimmed
    return (prompt_ids, prompt_mask) if first == 0 else (prompt_ids[:, first:], prompt_mask[:, first:])


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
    prompt_ids, prompt_mask = trim_padding(prompt_ids, prompt_mask)
    mask = prompt_mask.long()
    pos = positions(mask)
    cache, logits = prefill(model, prompt_ids, mask, "logits")
    logits = logits[:, -1]
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


def distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """The distinct prompts of a batch (ids and mask) and each row's index among them, where rows repeat prompts
    enough for one pass per distinct prompt to pay (at least two rows per prompt on average: GRPO's groups);
    None where they do not."""
    both = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    distinct, rows = torch.unique(both, dim=0, return_inverse=True)
    if 2 * len(distinct) > len(both):
        return None
    P = prompt_ids.shape[1]
    return distinct[:, :P], distinct[:, P:].to(prompt_mask.dtype), rows


def prefill(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, read: str) -> tuple[Any, Tensor]:
    """One forward pass over left-padded prompts: the KV cache, one row per prompt, and the output ``read``
    (``"logits"``, at the last column only; ``"last_hidden_state"`` of a trunk, at every column). Rows that
    share a prompt share its pass (:func:`distinct_prompts`): the prompt runs once and its cache and output
    are gathered per row, which is exact and carries the gradient of every row back to the one pass."""
    shared = distinct_prompts(prompt_ids, prompt_mask)
    ids, mask = (prompt_ids, prompt_mask) if shared is None else shared[:2]
    kwargs = {"logits_to_keep": 1} if read == "logits" else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True, **kwargs)
    cache, value = out.cache, getattr(out, read)
    if shared is not None:
        cache.batch_select_indices(shared[2])
        value = value[shared[2]]
    return cache, value


def completion_inputs(
    prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Prompt and completion as one sequence: ``input_ids``, ``attention_mask`` and ``position_ids``
    ``[N, P + C]`` (the completion's pads after its end are masked)."""
    ids = torch.cat([prompt_ids, tokens], dim=1)
    attn = torch.cat([prompt_mask.long(), mask.long()], dim=1)
    return ids, attn, positions(attn)


PASS_COST = 200
"""A pass's fixed cost (Python and per-op overhead), in the positions of one row it costs as much as: splitting a
batch by prompt length pays where it saves more positions than that. Measured on the 3-layer Llama of
``configs/rlhf_preference.yaml``, one thread: a training forward and backward costs about 8-12 ms plus 50 us per
position, a no-grad forward 5 ms plus 16 us (``docs/benchmarks.md``)."""


def length_groups(prompt_mask: Tensor, columns: int, pass_cost: float) -> list[Tensor]:
    """The rows, in groups by prompt length, so that passes over each group trimmed to its own longest prompt
    cost the fewest positions: each row costs its group's longest prompt plus ``columns`` (the completion's),
    each group ``pass_cost`` more. Rows of one length are never split (rows that share a prompt stay together).
    One group of all rows where splitting does not pay."""
    lengths = prompt_mask.sum(dim=1)
    order = torch.argsort(lengths, stable=True)
    ordered = lengths[order].tolist()
    n = len(ordered)
    ends = [j for j in range(1, n + 1) if j == n or ordered[j] != ordered[j - 1]]  # a group may end where it changes
    best, back = {0: 0.0}, {}
    for j in ends:  # best[j]: the cheapest split of the j shortest rows; back[j]: where its last group starts
        width = ordered[j - 1] + columns
        best[j], back[j] = min((best[i] + (j - i) * width + pass_cost, i) for i in best if i < j)
    groups, j = [], n
    while j > 0:
        groups.append(order[back[j] : j])
        j = back[j]
    return groups[::-1] if len(groups) > 1 else [torch.arange(n, device=lengths.device)]


def completion_outputs(
    model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor, read: str = "logits"
) -> Tensor:
    """The outputs ``read`` (``"logits"`` of a causal LM, ``"last_hidden_state"`` of its trunk) at the columns
    that predicted each completion token ``[N, C, ...]``: the last prompt column predicts the first token.

    Rows run in groups of like prompt length (:func:`length_groups`), each trimmed to its own longest prompt
    (:func:`trim_padding`), so short prompts do not pay for the longest one's columns; within a group the
    prompts run first (:func:`prefill`, once per distinct prompt where rows share them), then the completion's
    tokens but the last over their KV cache. The same numbers as one pass over prompt and completion, and
    gradients reach the prompt's columns through the cache."""
    groups = length_groups(prompt_mask, tokens.shape[1], PASS_COST)
    if len(groups) == 1:
        return _completion_outputs(model, *trim_padding(prompt_ids, prompt_mask), tokens, mask, read)
    outs = [
        _completion_outputs(model, *trim_padding(prompt_ids[g], prompt_mask[g]), tokens[g], mask[g], read)
        for g in groups
    ]
    order = torch.cat(groups)
    back = torch.empty_like(order)
    back[order] = torch.arange(len(order), device=order.device)
    return torch.cat(outs)[back]


def _completion_outputs(
    model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor, read: str
) -> Tensor:
    P, C = prompt_ids.shape[1], tokens.shape[1]
    cache, head = prefill(model, prompt_ids, prompt_mask, read)
    head = head[:, -1:]
    if C == 1:
        return head
    attn = torch.cat([prompt_mask.long(), mask.long()], dim=1)[:, : P + C - 1]
    pos = positions(attn)[:, P:]
    out = model(input_ids=tokens[:, : C - 1], attention_mask=attn, position_ids=pos, cache=cache, use_cache=True)
    return torch.cat([head, getattr(out, read)], dim=1)


def completion_logits(
    model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, tokens: Tensor, mask: Tensor
) -> Tensor:
    """The logits ``[N, C, V]`` that predicted each completion token (:func:`completion_outputs`)."""
    return completion_outputs(model, prompt_ids, prompt_mask, tokens, mask, "logits")


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
    logits = completion_logits(model, prompt_ids, prompt_mask, tokens, mask)
    return token_logp(logits, tokens, temperature, vocab)[0] * mask
