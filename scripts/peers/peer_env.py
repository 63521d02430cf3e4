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
