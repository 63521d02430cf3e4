"""Hugging Face models and tokenizers, offline: built from a config here, or loaded from a local folder.

A model folder is what ``save_pretrained`` writes: ``config.json``, the weights as ``model.safetensors`` and
the tokenizer (``tokenizer.json`` with its ``tokenizer_config.json``). Nothing is ever downloaded: the hub is
switched off before ``transformers`` is imported, and every load passes ``local_files_only``. Tokenizers are
trained here with ``tokenizers`` (byte-level BPE; with a vocabulary of the 256 bytes alone it is a byte-level
tokenizer, which suits digits and arithmetic).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported anywhere through this module
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import json
import logging
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from srl.api.config.text import LMSpec

CausalLM = Any
"""A ``transformers`` causal LM (``PreTrainedModel``): typed loosely, since its methods and config attributes
are not visible through ``nn.Module``."""

PAD = "<pad>"
EOS = "<eos>"

_quiet = False


def _quiet_transformers() -> None:
    """Keep transformers' config advice (hub-era defaults such as GPT-2's token ids) out of the run's log."""
    global _quiet
    if not _quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        logging.getLogger("transformers").setLevel(logging.ERROR)
        _quiet = True


class ModelError(ValueError):
    """A model folder or model spec that cannot be used; the message names it."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 256 + 2) -> Any:
    """A byte-level BPE tokenizer (a ``transformers.PreTrainedTokenizerFast``) trained on ``texts``, with
    ``<pad>`` (id 0) and ``<eos>`` (id 1). ``vocab_size`` 258 keeps the 256 bytes and learns no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    _quiet_transformers()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS)


def build_lm(spec: LMSpec, tokenizer: Any) -> CausalLM:
    """A new causal LM of ``spec`` for ``tokenizer``'s vocabulary, randomly initialized (by torch's RNG)."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

    _quiet_transformers()
    ids = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    config: Any
    if spec.arch == "gpt2":
        config = GPT2Config(
            n_embd=spec.width,
            n_layer=spec.layers,
            n_head=spec.heads,
            n_inner=spec.mlp,
            n_positions=spec.context,
            bos_token_id=tokenizer.eos_token_id,
            **ids,
        )
    else:
        mlp = spec.mlp or 32 * round(spec.width * 8 / 3 / 32)
        cls = LlamaConfig if spec.arch == "llama" else Qwen2Config
        config = cls(
            hidden_size=spec.width,
            intermediate_size=mlp,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            num_key_value_heads=spec.kv_heads or spec.heads,
            max_position_embeddings=spec.context,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.eos_token_id,
            **ids,
        )
    return AutoModelForCausalLM.from_config(config)


def save_lm(model: CausalLM, tokenizer: Any, folder: str | Path, meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``model`` (safetensors) and ``tokenizer`` to ``folder`` atomically (:func:`write_folder`); ``meta``
    goes to ``srl.json``."""

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if meta is not None:
            (tmp / "srl.json").write_text(json.dumps(dict(meta), indent=1) + "\n")

    return write_folder(folder, write)


def write_folder(folder: str | Path, write: Callable[[Path], None]) -> Path:
    """Fill ``folder`` through ``write(tmp)`` into a sibling temporary folder first, then rename it into place, so a
    reader never sees half a model (an existing folder is replaced whole)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _sweep_dead(folder)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(folder)
    return folder


def _sweep_dead(folder: Path) -> None:
    """Remove the temporary siblings of ``folder`` that a killed writer left (their process is gone)."""
    for path in folder.parent.glob(f".{folder.name}.*-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # alive, someone else's
            pass


def load_tokenizer(folder: str | Path, where: str = "text.model") -> Any:
    """The tokenizer of a local model folder; one line naming the folder when it has none, and one when it
    lacks a pad or end-of-sequence token (generation needs both)."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    path = _folder(folder, where)
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ModelError(f"{where}: {str(path)!r} has no usable tokenizer ({type(exc).__name__}: {exc})") from None
    if tok.eos_token_id is None:
        raise ModelError(f"{where}: the tokenizer in {str(path)!r} has no end-of-sequence token")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # the usual choice for GPT-2-style tokenizers; pads are always masked
    return tok


def load_lm(folder: str | Path, where: str = "text.model") -> CausalLM:
    """The causal LM of a local model folder (``from_pretrained``, never a download), in float32 and eval mode.
    Under a ``torch.device("meta")`` context (the run's plan sizing its streams) only the architecture is built:
    shapes, no weights read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _quiet_transformers()
    path = _folder(folder, where)
    try:
        if torch.get_default_device().type == "meta":
            config = AutoConfig.from_pretrained(path, local_files_only=True)
            return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except Exception as exc:
        raise ModelError(f"{where}: cannot load a causal LM from {str(path)!r} ({type(exc).__name__}: {exc})") from None
    return model.eval()


def _folder(folder: str | Path, where: str) -> Path:
    path = Path(folder)
    if not path.is_dir():
        raise ModelError(f"{where}: model folder {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise ModelError(f"{where}: {str(path)!r} is not a model folder (no config.json)")
    return path
