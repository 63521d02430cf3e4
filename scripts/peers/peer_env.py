"""What the TRL peer scripts do before their heavy imports (import this module first): start the clock their
``wall_s`` counts from, keep every hub offline, and put the repository root on ``sys.path`` (the tasks'
prompt and reward modules, ``srl.text.arithmetic`` and ``srl.text.preference``, need only numpy and the
standard library, so srl itself need not be installed in the peer's venv)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

T0 = time.perf_counter()  # "since process start"
REPO = Path(__file__).resolve().parents[2]

for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_DISABLED": "true",
    "TOKENIZERS_PARALLELISM": "false",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}.items():
    os.environ.setdefault(key, value)
sys.path.insert(0, str(REPO))


def time_generate(model, batch, kwargs: dict, repeats: int, count, extra: dict) -> dict:
    """The generation ceiling: ``model.generate(**batch(), **kwargs)`` alone, one warm-up call, then ``repeats``
    timed calls on fresh batches. ``count(completion_ids)`` counts a batch's completion tokens (the end token
    included, as srl counts them); ``extra`` goes into the returned record (the settings)."""
    import torch

    tokens = positions = 0
    seconds = 0.0
    with torch.no_grad():
        model.generate(**batch(), **kwargs)  # warm-up
        for _ in range(repeats):
            enc = batch()
            t = time.perf_counter()
            out = model.generate(**enc, **kwargs)
            seconds += time.perf_counter() - t
            completions = out[:, enc["input_ids"].shape[1] :]
            tokens += count(completions)
            positions += completions.numel()
    return {
        "mode": "generate_only",
        **extra,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "completion_tokens": tokens,
        "generated_positions": positions,
        "seconds": round(seconds, 4),
        "completion_tokens_per_s": round(tokens / seconds, 1),
        "generated_positions_per_s": round(positions / seconds, 1),
        "total_wall_s": round(time.perf_counter() - T0, 3),
    }
