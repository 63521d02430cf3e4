"""Language models as a workload: generation, the text task, bad input, and PPO / GRPO runs that learn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from srl.api.config import ConfigError, build, to_dict
from srl.api.config.experiment import ExperimentConfig
from srl.text.algorithm import prompt_mask
from srl.text.generate import StopStrings, completion_logp, generate, positions
from srl.api.config.text import LMSpec
from srl.text.hf import build_lm, load_lm, load_tokenizer, save_lm, train_tokenizer
from srl.text.pretrain import pretrain
from srl.text.task import TaskError, TextTask
from srl.text.testing import digits

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return train_tokenizer(["0123456789+=abc xyz\n"])


@pytest.fixture(scope="module")
def digit_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama pre-trained for a few steps on digit strings: it writes digits, about a tenth of them 7."""
    folder = tmp_path_factory.mktemp("models") / "digits"
    spec = LMSpec(arch="llama", layers=1, width=32, heads=2, context=32)
    pretrain(digits, spec, folder, steps=60, batch_size=32, lr=3e-3, vocab_size=258, log_every=0)
    return folder


def _left_padded(tokenizer: Any, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_kv_cache_log_probs_equal_a_full_forward_pass(tokenizer: Any, arch: str) -> None:
    torch.manual_seed(0)
    model = build_lm(LMSpec(arch=arch, layers=2, width=32, heads=4, kv_heads=2 if arch != "gpt2" else None), tokenizer)
    model.eval()
    ids, mask = _left_padded(tokenizer, ["12+3=", "7+8888=", "abc", "1"])
    stop = StopStrings(tokenizer, ["xyz"])
    out = generate(
        model, ids, mask, 10, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
        temperature=0.7, top_p=0.9, stop=stop, generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    C = out.tokens.shape[1]
    valid = (torch.arange(C)[None] < out.lengths[:, None]).float()
    full = completion_logp(model, ids, mask, out.tokens, valid, 0.7)
    assert torch.allclose(full, out.logp, atol=1e-5), (full - out.logp).abs().max()
    assert bool((out.logp[valid == 0] == 0).all())
    assert bool((out.tokens[valid == 0] == tokenizer.pad_token_id).all())


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_rows_that_share_a_prompt_share_its_pass_exactly(tokenizer: Any, arch: str) -> None:
    """Groups of rows with one prompt (GRPO) run the prompt once and the completions over its gathered cache:
    the logits and every parameter's gradient equal those of one plain pass over prompt and completion."""
    from srl.text.generate import completion_inputs, completion_outputs, distinct_prompts

    torch.manual_seed(0)
    model = build_lm(LMSpec(arch=arch, layers=2, width=32, heads=4, kv_heads=2 if arch != "gpt2" else None), tokenizer)
    model.eval()
    ids, mask = _left_padded(tokenizer, ["12+3=", "7+8888=", "abc"] * 2 + ["1", "7+8888="])
    shared = distinct_prompts(ids, mask)
    assert shared is not None and len(shared[0]) == 4 and shared[2].tolist()[:3] == shared[2].tolist()[3:6]
    tokens = torch.randint(2, 20, (len(ids), 5))
    valid = (torch.arange(5)[None] < torch.tensor([5, 1, 3, 5, 2, 4, 5, 5])[:, None]).float()

    def grads(logits: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        (logits.log_softmax(-1) * valid[..., None]).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    ours = completion_outputs(model, ids, mask, tokens, valid)
    full_ids, attn, pos = completion_inputs(ids, mask, tokens, valid)
    P = ids.shape[1]
    plain = model(input_ids=full_ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : P + 4]
    rows = valid.bool()  # after a completion's end its pads are masked out: their logits are not compared
    assert torch.allclose(ours[rows], plain[rows], atol=1e-5), (ours[rows] - plain[rows]).abs().max()
    for a, b in zip(grads(ours), grads(plain), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-4), (a - b).abs().max()  # gradients run to ~30
    assert distinct_prompts(ids[:4], mask[:4]) is None  # three prompts in four rows: one pass is cheaper


def test_rows_split_by_prompt_length_where_it_saves_the_most_positions() -> None:
    """The split into groups is the cheapest of every split of the rows sorted by length (brute force), keeps rows
    of one length together, and is one group where a pass costs more than splitting saves."""
    import itertools

    from srl.text.generate import length_groups

    def cost(groups: list[torch.Tensor], lengths: torch.Tensor, columns: int, pass_cost: float) -> float:
        return sum(len(g) * (int(lengths[g].max()) + columns) + pass_cost for g in groups)

    rng = np.random.default_rng(0)
    for trial in range(30):
        n = int(rng.integers(1, 9))
        lengths = torch.from_numpy(rng.integers(1, 12, n))
        mask = (torch.arange(12)[None] >= 12 - lengths[:, None]).long()  # left-padded
        columns, pass_cost = int(rng.integers(1, 6)), float(rng.choice([0, 3, 10, 1000]))
        groups = length_groups(mask, columns, pass_cost)
        rows = torch.cat(groups).sort().values
        assert rows.tolist() == list(range(n))  # every row once
        for a, b in itertools.combinations(groups, 2):  # one length never in two groups
            assert not set(lengths[a].tolist()) & set(lengths[b].tolist())
        ordered = lengths.argsort(stable=True)
        best = min(
            cost([ordered[i:j] for i, j in zip((0, *cuts), (*cuts, n))], lengths, columns, pass_cost)
            for k in range(n)
            for cuts in itertools.combinations(range(1, n), k)
        )
        assert cost(groups, lengths, columns, pass_cost) == pytest.approx(best), trial
        if pass_cost == 1000:
            assert len(groups) == 1
    mask = (torch.arange(40)[None] >= 40 - torch.tensor([3] * 24 + [40] * 8)[:, None]).long()
    assert [len(g) for g in length_groups(mask, 4, 50)] == [24, 8]  # short prompts no longer pay for long ones


def test_rows_in_groups_of_like_prompt_length_give_the_numbers_of_one_pass(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows split by prompt length (each group trimmed to its own longest prompt) give the logits and gradients of
    one plain pass over prompt and completion, in the rows' own order."""
    import srl.text.generate as gen

    torch.manual_seed(0)
    model = build_lm(LMSpec(arch="llama", layers=2, width=32, heads=4, kv_heads=2), tokenizer).eval()
    ids, mask = _left_padded(tokenizer, ["1", "12+3=4567+89=", "7+1", "ab", "xyz abc 0123456789+", "3+4="])
    tokens = torch.randint(2, 20, (len(ids), 5))
    valid = (torch.arange(5)[None] < torch.tensor([5, 2, 5, 4, 1, 3])[:, None]).float()
    monkeypatch.setattr(gen, "PASS_COST", 0)  # every length its own group
    assert len(gen.length_groups(mask, 5, gen.PASS_COST)) == 6
    ours = gen.completion_outputs(model, ids, mask, tokens, valid)
    ours.log_softmax(-1).mul(valid[..., None]).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full_ids, attn, pos = gen.completion_inputs(ids, mask, tokens, valid)
    P = ids.shape[1]
    plain = model(input_ids=full_ids, attention_mask=attn, position_ids=pos).logits[:, P - 1 : P + 4]
    plain.log_softmax(-1).mul(valid[..., None]).sum().backward()
    rows = valid.bool()
    assert torch.allclose(ours[rows], plain[rows], atol=1e-5), (ours[rows] - plain[rows]).abs().max()
    for a, p in zip(grads, model.parameters(), strict=True):
        assert torch.allclose(a, p.grad, rtol=1e-5, atol=1e-4), (a - p.grad).abs().max()


def test_a_left_padded_prompt_generates_as_it_would_alone(tokenizer: Any) -> None:
    torch.manual_seed(1)
    model = build_lm(LMSpec(arch="llama", layers=2, width=32, heads=4), tokenizer).eval()
    kw = {"eos_id": tokenizer.eos_token_id, "pad_id": tokenizer.pad_token_id, "greedy": True}
    ids, mask = _left_padded(tokenizer, ["1+2=", "123456+7="])
    together = generate(model, ids, mask, 8, **kw)
    alone_ids, alone_mask = _left_padded(tokenizer, ["1+2="])
    alone = generate(model, alone_ids, alone_mask, 8, **kw)
    assert together.tokens[0].tolist() == alone.tokens[0].tolist()
    assert torch.allclose(together.logp[0], alone.logp[0], atol=1e-5)
    assert positions(mask)[0].tolist()[-4:] == [0, 1, 2, 3]


def test_columns_of_padding_only_are_trimmed_and_change_nothing(tokenizer: Any) -> None:
    """A batch padded wider than its longest prompt (a task pads to its max_prompt_tokens) loses the columns that
    are padding in every row, and generates the same completions, log-probs and all."""
    from srl.text.generate import trim_padding

    torch.manual_seed(1)
    model = build_lm(LMSpec(arch="llama", layers=2, width=32, heads=4), tokenizer).eval()
    ids, mask = _left_padded(tokenizer, ["1+2=", "12+7="])
    pad = tokenizer.pad_token_id
    wide_ids = torch.cat([torch.full((2, 3), pad), ids], dim=1)
    wide_mask = torch.cat([torch.zeros((2, 3), dtype=mask.dtype), mask], dim=1)
    narrow = trim_padding(wide_ids, wide_mask)
    assert torch.equal(narrow[0], ids) and torch.equal(narrow[1], mask)
    assert trim_padding(ids, mask)[0] is ids  # nothing to trim: the same tensors
    kw = {"eos_id": tokenizer.eos_token_id, "pad_id": pad, "temperature": 0.8}
    a = generate(model, wide_ids, wide_mask, 6, generator=torch.Generator().manual_seed(3), **kw)
    b = generate(model, ids, mask, 6, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)
    assert torch.allclose(a.logp, b.logp, atol=1e-6)


def test_top_p_draws_only_from_the_nucleus() -> None:
    from srl.text.generate import _sample

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    drawn = _sample(logits, 0.7, torch.Generator().manual_seed(0))
    counts = torch.bincount(drawn, minlength=4).float() / len(drawn)
    assert counts[2] == 0 and counts[3] == 0  # 0.5 + 0.3 reach 0.7: the rest is cut
    assert abs(float(counts[0]) - 0.5 / 0.8) < 0.03


def test_stop_strings_end_completions(tokenizer: Any) -> None:
    """A completion ends when the token just made completes a stop string (earlier ones were checked before)."""
    stop = StopStrings(tokenizer, ["b c"])
    rows = tokenizer(["xxa b c", "xxxxa b", "zzzzb c", "b czzzz"], add_special_tokens=False)["input_ids"]
    ended = stop(torch.tensor(rows), torch.tensor([0, 1, 2]))
    assert ended.tolist() == [True, False, True]


def test_prompt_mask_counts_from_the_first_real_token() -> None:
    ids = torch.tensor([[0, 0, 5, 0, 6], [4, 5, 6, 7, 8]])
    assert prompt_mask(ids, 0).tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]


def test_model_folders_round_trip(tmp_path: Path, tokenizer: Any) -> None:
    torch.manual_seed(2)
    model = build_lm(LMSpec(arch="gpt2", layers=1, width=16, heads=2), tokenizer)
    save_lm(model, tokenizer, tmp_path / "m", {"note": 1})
    assert (tmp_path / "m" / "model.safetensors").is_file()
    again = load_lm(tmp_path / "m")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert load_tokenizer(tmp_path / "m").pad_token_id == tokenizer.pad_token_id
    dead = tmp_path / ".m.tmp-999999999"  # what a writer killed mid-way leaves (no such process)
    dead.mkdir()
    save_lm(again, tokenizer, tmp_path / "m")  # overwriting leaves one folder and no temporary ones
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_missing_model_folders_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_lm(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_tokenizer(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------- the text task
def _task(model: Path, **kw: Any) -> TextTask:
    args = {
        "tokenizer": str(model),
        "prompts": "srl.text.testing:digit_prompts",
        "reward": "srl.text.testing:sevens",
        "max_prompt_tokens": 4,
        "max_new_tokens": 5,
    }
    args.update(kw)
    return TextTask(**args)


def test_task_groups_prompts_and_scores_completions(digit_model: Path) -> None:
    task = _task(digit_model, num_envs=6, group_size=3, stop=["9"])
    obs = task.reset(0)["obs"]
    assert obs.shape == (6, 4) and obs.dtype == np.int32
    assert (obs[0] == obs[1]).all() and (obs[1] == obs[2]).all() and (obs[3] == obs[5]).all()
    assert task.prompts[0] == task.prompts[2] and task.single_action_space.shape == (5,)
    tok = task.tokenizer
    seven, eos, pad = tok.convert_tokens_to_ids("7"), tok.eos_token_id, tok.pad_token_id
    other = tok.convert_tokens_to_ids("1")
    nine = tok.convert_tokens_to_ids("9")
    actions = np.array(
        [
            [seven, seven, eos, pad, pad],  # "77"
            [seven, other, seven, other, other],  # "71711"
            [eos, pad, pad, pad, pad],  # ""
            [seven, nine, seven, seven, seven],  # "7" before the stop string
            [other, other, other, other, other],
            [seven, seven, seven, seven, seven],
        ]
    )
    assert task.completions(actions) == ["77", "71711", "", "7", "11111", "77777"]
    step = task.step(actions)
    assert np.allclose(step.reward, [1.0, 0.4, 0.0, 1.0, 0.0, 1.0])
    assert step.terminated.all() and step.episode_end.all() and not step.truncated.any()


def test_prompt_generators_take_their_own_settings(digit_model: Path) -> None:
    from srl.text.arithmetic import held_out

    task = _task(digit_model, num_envs=64, prompts="srl.text.arithmetic:prompts", prompt_args={"digits": 1})
    task.reset(0)
    pairs = [tuple(map(int, p[:-1].split("+"))) for p in task.prompts]
    assert all(a < 10 and b < 10 and not held_out(a, b) for a, b in pairs)
    held = _task(
        digit_model,
        num_envs=64,
        prompts="srl.text.arithmetic:prompts",
        prompt_args={"digits": 2},
        split="eval",
        max_prompt_tokens=6,
    )
    held.reset(0)
    assert all(held_out(*map(int, p[:-1].split("+"))) for p in held.prompts)
    with pytest.raises(ConfigError, match="env.kwargs.prompt_args: expected a mapping"):
        _task(digit_model, prompt_args=[2])


def test_arithmetic_rewards_against_hand_scored_answers() -> None:
    """Exact match ignores surrounding spaces only; partial credit counts digits in place from the units up,
    over the longer answer, at half weight, so no near miss reaches an exact answer's 1."""
    from srl.text.arithmetic import corpus, digit_match, exact_match, exact_match_reversed

    prompts = ["48+39="] * 6 + ["1+1=", "99+99="]
    answers = ["87", " 87 ", "97", "8", "x7", "187", "02", "198"]
    assert exact_match(prompts, answers) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert digit_match(prompts, answers) == [1.0, 1.0, 0.25, 0.0, 0.0, 0.5 * 2 / 3, 0.25, 1.0]
    # Units first: 87 is "78", 2 is "2" (not "20"), 198 is "891".
    assert exact_match_reversed(prompts, ["78", " 78", "87", "7", "x8", "781", "2", "891"]) == [
        *[1.0, 1.0, 0.0, 0.0, 0.0, 0.0],
        *[1.0, 1.0],
    ]
    rng = np.random.default_rng(0)
    solved = corpus(rng, 200, digits=3, reverse=True)
    assert exact_match_reversed([p for p, _ in solved], [a for _, a in solved]) == [1.0] * 200
    assert sum(exact_match([p for p, _ in solved], [a for _, a in solved])) < 200  # palindromic sums only
    with pytest.raises(ValueError, match="not an addition prompt"):
        digit_match(["hello"], ["1"])


def test_eval_split_answers_each_prompt_once(digit_model: Path) -> None:
    task = _task(digit_model, num_envs=4, group_size=2, split="eval")
    task.reset(0)
    assert task.group_size == 1


def test_prompt_files_and_their_bad_lines(tmp_path: Path, digit_model: Path) -> None:
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "12"}\n\n{"prompt": "3", "id": 7}\n')
    task = _task(digit_model, num_envs=4, prompts=str(good))
    task.reset(1)
    assert sorted(set(task.prompts)) == ["12", "3"]
    cases = {
        '{"prompt": "12"}\nnot json\n': "line 2: not JSON",
        '{"text": "12"}\n': "line 1: expected an object with a 'prompt' string",
        '{"prompt": "1234567890"}\n': "is 10 tokens, longer than 4",
        "\n": "has no prompts",
    }
    for content, message in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(content)
        with pytest.raises(ConfigError, match=message):
            _task(digit_model, prompts=str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        _task(digit_model, prompts=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="env.kwargs.tokenizer"):
        _task(tmp_path / "no_model")


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        ("raises", "raised ZeroDivisionError"),
        ("short", "returned 1 rewards for 2 completions"),
        ("words", "returned str, not a list of numbers"),
        ("nan", "non-finite reward"),
    ],
)
def test_reward_functions_that_misbehave_are_one_line(
    reward: str, message: str, digit_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bad_rewards.py").write_text(
        "def raises(p, c):\n    return 1 / 0\n"
        "def short(p, c):\n    return [1.0]\n"
        "def words(p, c):\n    return 'ab'\n"
        "def nan(p, c):\n    return [float('nan')] * len(c)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    task = _task(digit_model, num_envs=2, reward=f"bad_rewards:{reward}")
    task.reset(0)
    with pytest.raises(TaskError, match=message):
        task.step(np.zeros((2, 5), np.int64))


# ---------------------------------------------------------------------------------------------- runs
def _config(model: Path, **over: Any) -> ExperimentConfig:
    data: dict[str, Any] = {
        "name": "lm_test",
        "seed": 3,
        "runtime": "inline",
        "algorithm": "lm_ppo",
        "env": {
            "id": "srl.text.task:TextTask",
            "kwargs": {
                "tokenizer": str(model),
                "prompts": "srl.text.testing:digit_prompts",
                "reward": "srl.text.testing:sevens",
                "max_prompt_tokens": 4,
                "max_new_tokens": 4,
                "group_size": 8,
            },
        },
        "workers": {"actors": 1, "ring_size": 1, "envs_per_slot": 64, "policy_workers": 0, "segment_length": 1,
                    "batch_segments": 1},
        "text": {"model": str(model), "advantage": "group", "kl_coef": 0.01, "kl_in": "loss"},
        "ppo": {"lr": 3e-3, "gamma": 1.0, "epochs": 2, "minibatches": 2, "max_grad_norm": 1.0},
        "run": {"total_env_steps": 64 * 40, "eval_episodes": 64, "target_return": 0.8, "log_interval_seconds": 60},
    }  # fmt: skip
    for key, value in over.items():
        section, _, name = key.partition(".")
        data[section] = {**data[section], name: value} if name else value
    return build(ExperimentConfig, data)


@pytest.mark.parametrize(
    ("advantage", "reference_on"), [("group", "trainer"), ("group", "generator"), ("gae", "trainer")]
)
def test_rl_raises_the_reward_inline(digit_model: Path, tmp_path: Path, advantage: str, reference_on: str) -> None:
    """The digit model writes about a tenth sevens; GRPO and PPO (with a critic and the KL in the reward) both
    teach it to write mostly sevens: the run stops when the training return reaches 0.8."""
    from srl.runtime.train import train

    text = {"model": str(digit_model), "advantage": advantage, "kl_coef": 0.01, "reference_on": reference_on}
    text["kl_in"] = "loss" if advantage == "group" else "reward"
    run = {**to_dict(_config(digit_model).run), "eval_initial": True}
    cfg = _config(digit_model, text=text, run=run)
    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["stop_reason"] == "solved", summary
    assert summary["final_eval_return_mean"] >= 0.8
    assert summary["initial_eval_return_mean"] < 0.5  # the same held-out prompts, before any update
    samples = summary["final_eval_samples"]  # a few completions to read, with their rewards
    assert len(samples) == 8 and all(set(s) == {"prompt", "completion", "reward"} for s in samples)
    assert np.mean([s["reward"] for s in samples]) == pytest.approx(np.mean(summary["final_eval_returns"][:8]))
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    for key in ("reward", "kl", "entropy", "response_length", "clip_fraction", "tokens_per_second"):
        assert np.isfinite(last[key]), key
    assert 0 < last["response_length"] <= 4 and last["tokens_per_second"] > 0


def _trainer_and_batch(cfg: ExperimentConfig) -> tuple[Any, dict[str, np.ndarray]]:
    """The run's lm_ppo trainer, and a batch of 64 completions sampled at seed 0 by its acting policy, scored."""
    from srl.text.algorithm import LMPPO
    from srl.wiring import context

    task = TextTask(**cfg.env.kwargs, num_envs=64)
    ctx = context(task.single_observation_space, task.single_action_space, cfg)
    torch.manual_seed(0)
    obs = task.reset(0)
    out = LMPPO.acting_policy(ctx).act(obs)
    batch = {k: v[None] for k, v in out.items()}
    batch.update({"obs": obs["obs"][None], "rewards": task.step(out["actions"]).reward[None].astype(np.float32)})
    return LMPPO(ctx), batch


def _update(cfg: ExperimentConfig, fuse: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
    """One lm_ppo update on 64 completions sampled at seed 0 by the run's acting policy: the policy's weights after
    it, and its stats (``fuse``: the first minibatch's proximal log-probs from its own forward)."""
    algo, batch = _trainer_and_batch(cfg)
    algo.fuse_first_minibatch = fuse
    stats = algo.train(batch, 0.0).stats
    return torch.from_numpy(algo.policy_state()), stats


def test_an_update_under_bfloat16_autocast_trains_float32_weights(digit_model: Path) -> None:
    """``workers.trainer_dtype: bfloat16``: the passes of an lm_ppo update (policy, reference, critic) run under
    autocast on the trainer's device (here the CPU; tests/test_gpu.py on CUDA); the weights stay float32."""
    base = _config(digit_model)
    text = {"model": str(digit_model), "advantage": "gae", "kl_coef": 0.05, "kl_in": "reward"}
    cfg = _config(digit_model, workers={**to_dict(base.workers), "trainer_dtype": "bfloat16"}, text=text)
    algo, batch = _trainer_and_batch(cfg)
    before = algo.policy_state().copy()
    stats = algo.train(batch, 0.0).stats
    assert all(np.isfinite(v) for v in stats.values()) and not np.array_equal(before, algo.policy_state())
    assert all(p.dtype == torch.float32 for p in algo.policy.parameters())


@pytest.mark.parametrize("advantage", ["group", "gae"])
def test_an_update_is_the_same_wherever_its_log_probs_are_taken(digit_model: Path, advantage: str) -> None:
    """The first minibatch's proximal log-probs taken from its own forward, and the reference's taken by the
    generator (sent in the sample), change no number of the update: the same weights after it, the same stats."""
    text = {"model": str(digit_model), "advantage": advantage, "kl_coef": 0.05, "kl_in": "loss"}
    ppo = {**to_dict(_config(digit_model).ppo), "td_compensation": True}
    base = _config(digit_model, text=text, ppo=ppo)
    weights, stats = _update(base, fuse=False)
    for cfg, fuse in ((base, True), (_config(digit_model, text={**text, "reference_on": "generator"}, ppo=ppo), True)):
        w, s = _update(cfg, fuse)
        # a pass with gradients and one without round differently (about 1e-7), and Adam's first step magnifies
        # that on weights whose gradient is near its eps; log-probs from the wrong weights would move many of
        # them by a sizeable share of the learning rate (3e-3)
        assert torch.allclose(w, weights, atol=1e-5), (cfg.text.reference_on, fuse)
        # not the timings, nor the share of IS ratios above is_rho_clip = 1: at the start they are 1 +- rounding
        same = [k for k in s if "per_second" not in k and k != "is_weight_truncated"]
        assert s.keys() == stats.keys() and all(s[k] == pytest.approx(stats[k], rel=1e-4, abs=1e-6) for k in same)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6) and stats["is_weight_mean"] == pytest.approx(
        1.0, abs=1e-4
    )  # at the start: one model


def test_the_critic_on_a_thread_of_its_own_changes_no_number(digit_model: Path) -> None:
    """PPO with a critic: the critic's passes on their own thread (text.critic_thread) or on the trainer's give
    the same policy, the same critic and the same stats."""
    results = []
    for threaded in (True, False):
        text = {"model": str(digit_model), "advantage": "gae", "kl_coef": 0.05, "kl_in": "reward"}
        algo, batch = _trainer_and_batch(_config(digit_model, text={**text, "critic_thread": threaded}))
        assert (algo._critic_pool is not None) == threaded
        stats = [algo.train(batch, 0.0).stats for _ in range(2)]
        assert algo.critic is not None
        results.append((algo.policy_state(), [p.detach().clone() for p in algo.critic.parameters()], stats))
    (policy_a, critic_a, stats_a), (policy_b, critic_b, stats_b) = results
    assert np.array_equal(policy_a, policy_b)
    assert all(torch.equal(a, b) for a, b in zip(critic_a, critic_b, strict=True))
    assert not torch.equal(critic_a[-1], torch.zeros_like(critic_a[-1]))  # the critic did train (its head's bias)
    for a, b in zip(stats_a, stats_b, strict=True):
        assert a["value_loss"] > 0
        assert {k: v for k, v in a.items() if "per_second" not in k} == {
            k: v for k, v in b.items() if "per_second" not in k
        }


def test_the_reward_named_is_the_one_used(digit_model: Path, tmp_path: Path) -> None:
    from srl.runtime.train import train

    kwargs = {**_config(digit_model).env.kwargs, "reward": "srl.text.testing:lengths", "group_size": 1}
    cfg = _config(
        digit_model,
        env={"id": "srl.text.task:TextTask", "kwargs": kwargs},
        text={"model": str(digit_model), "advantage": "gae"},
        run={"total_env_steps": 64, "eval_episodes": 16, "log_interval_seconds": 60},
    )
    summary = train(cfg, tmp_path / "run", progress=None)
    # lengths in characters: whole numbers up to the budget of 4, averaging well above 1 for sampled digit
    # strings (the share of sevens never exceeds 1)
    assert all(float(x).is_integer() and 0 <= x <= 4 for x in summary["final_eval_returns"])
    assert summary["train_return_mean"] > 1.0, summary


def test_bad_text_configs_are_one_line(digit_model: Path, tmp_path: Path) -> None:
    from srl.runtime.plan import make_plan

    cfg = _config(digit_model, text={"model": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match=r"text.model: model folder .*nowhere.* does not exist"):
        from srl.text.pretrain import ensure_base

        ensure_base(cfg)
    kwargs = {**_config(digit_model).env.kwargs, "max_new_tokens": 40}
    with pytest.raises(ConfigError, match="exceed the context"):
        make_plan(_config(digit_model, env={"id": "srl.text.task:TextTask", "kwargs": kwargs}))
    kwargs = {**_config(digit_model).env.kwargs, "group_size": 1}
    with pytest.raises(ConfigError, match="text.advantage: group .* needs env.kwargs.group_size >= 2"):
        make_plan(_config(digit_model, env={"id": "srl.text.task:TextTask", "kwargs": kwargs}))
    kwargs = {**_config(digit_model).env.kwargs, "group_size": 6}
    with pytest.raises(ConfigError, match="workers.envs_per_slot: 64 completions per slot do not split into groups"):
        make_plan(_config(digit_model, env={"id": "srl.text.task:TextTask", "kwargs": kwargs}))


def test_a_bad_base_model_spec_names_its_field(digit_model: Path) -> None:
    base = {"corpus": "srl.text.testing:digits", "model": {"arch": "mamba"}}
    with pytest.raises(ConfigError, match=r"text.base.model.arch: must be one of gpt2, llama, qwen2"):
        _config(digit_model, text={"model": str(digit_model), "base": base})
    base["model"] = {"width": 30, "heads": 4}
    with pytest.raises(ConfigError, match=r"text.base.model.width: 30 is not a multiple of heads 4"):
        _config(digit_model, text={"model": str(digit_model), "base": base})


def test_cli_missing_model_folder(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        json.dumps(
            {
                "algorithm": "lm_ppo",
                "runtime": "inline",
                "env": {"id": "srl.text.task:TextTask", "kwargs": {"tokenizer": str(tmp_path / "m"),
                        "prompts": "srl.text.testing:digit_prompts", "reward": "srl.text.testing:sevens"}},
                "text": {"model": str(tmp_path / "m")},
            }
        )
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "srl.cli.main", "train", str(cfg), "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "text.model" in lines[0] and "does not exist" in lines[0], done.stderr


# ---------------------------------------------------------------------------------------------- reward models
def test_bradley_terry_loss_by_hand() -> None:
    from srl.text.reward_model import bradley_terry_loss

    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 1.0])
    expected = -np.mean(np.log(1 / (1 + np.exp(-np.array([2.0, 0.0, -2.0])))))
    assert float(bradley_terry_loss(chosen, rejected)) == pytest.approx(expected, rel=1e-6)


def test_a_reward_model_learns_the_oracles_preferences_and_scores_a_task(digit_model: Path, tmp_path: Path) -> None:
    """Pairs of the digit model's completions labelled by the share of sevens: the trained model orders held-out
    pairs as the oracle does, and a task scores its completions with it (``reward_args``)."""
    from srl.text.reward_model import RewardModelScorer, load_reward_model, train_reward_model
    from srl.text.testing import digit_prompts, sevens

    folder = tmp_path / "rm"
    meta = train_reward_model(
        str(digit_model), digit_prompts, sevens, str(folder),
        pairs=512, steps=150, batch_size=32, lr=3e-3, max_new_tokens=4,
    )  # fmt: skip
    assert meta["held_out_accuracy"] >= 0.8, meta
    model, _ = load_reward_model(folder)
    assert isinstance(model.head, torch.nn.Linear)
    scorer = RewardModelScorer(str(folder))
    high, low = scorer(["12", "12"], ["7777", "1234"])
    assert high > low
    task = _task(
        digit_model, num_envs=2, reward="srl.text.reward_model:RewardModelScorer", reward_args={"folder": str(folder)}
    )
    task.reset(0)
    tok = task.tokenizer
    seven, one = tok.convert_tokens_to_ids("7"), tok.convert_tokens_to_ids("1")
    step = task.step(np.array([[seven] * 5, [one] * 5]))
    assert step.reward[0] > step.reward[1]
    with pytest.raises(ConfigError, match="is not a reward-model folder"):
        _task(digit_model, reward="srl.text.reward_model:RewardModelScorer", reward_args={"folder": str(digit_model)})
    with pytest.raises(ConfigError, match="env.kwargs.reward_args: expected a mapping"):
        _task(digit_model, reward_args=["x"])


@pytest.mark.slow
def test_the_pipeline_makes_a_missing_reward_model_once(digit_model: Path, tmp_path: Path) -> None:
    from srl.text.reward_model import ensure_reward_model

    rm = tmp_path / "rm"
    kwargs = {**_config(digit_model).env.kwargs, "reward": "srl.text.reward_model:RewardModelScorer"}
    kwargs["reward_args"] = {"folder": str(rm)}
    text = {"model": str(digit_model), "reward_model": {"folder": str(rm), "oracle": "srl.text.testing:sevens",
            "pairs": 256, "steps": 30, "batch_size": 16}}  # fmt: skip
    cfg = _config(digit_model, env={"id": "srl.text.task:TextTask", "kwargs": kwargs}, text=text)
    assert ensure_reward_model(cfg) and (rm / "score_head.safetensors").is_file()
    meta = json.loads((rm / "srl.json").read_text())
    assert meta["pairs"] > 0 and meta["held_out_accuracy"] is not None
    assert not ensure_reward_model(cfg)  # cached: a second run finds it
    no_oracle = _config(digit_model, text={"model": str(digit_model), "reward_model": {"folder": str(tmp_path / "x")}})
    with pytest.raises(ConfigError, match="does not exist .and no oracle labels pairs"):
        ensure_reward_model(no_oracle)


def test_a_text_run_resumes_from_its_checkpoint(digit_model: Path, tmp_path: Path) -> None:
    from srl.runtime.train import resume_config, train

    # inline, the first update comes once the batch and the 3 sample buffers are full: after 4 x 64 completions
    run = {**to_dict(_config(digit_model).run), "total_env_steps": 64 * 6, "target_return": None}
    first = train(_config(digit_model, run=run), tmp_path / "run", progress=None)
    cfg, resume = resume_config(tmp_path / "run", ["run.total_env_steps=768"])
    assert 1 <= resume.versions[0] <= first["policy_version"]
    again = train(cfg, tmp_path / "run", progress=None, resume=resume)
    assert again["policy_version"] > resume.versions[0] and again["resumed_from"] == str(resume.checkpoints[0])
    assert again["env_steps"] >= 768
    with pytest.raises(ConfigError, match="text.advantage: cannot change when resuming"):
        resume_config(tmp_path / "run", ["text.advantage=gae"])


def test_a_reward_worker_scores_as_the_actors_would(digit_model: Path, tmp_path: Path) -> None:
    """``env.kwargs.reward_on: stage``: the actors' tasks leave the rewards to the reward worker, which writes the
    task's own scores into each segment (the numbers the actors would have given) and reports the returns; a run
    that scores there learns as one that scores in the actors, and its return counts every scored completion."""
    from srl.api.stage import StageContext
    from srl.runtime.train import train
    from srl.text.reward_stage import NAME, RewardStage

    kwargs = {**_config(digit_model).env.kwargs, "reward_on": "stage"}
    run = {**to_dict(_config(digit_model).run), "total_env_steps": 64 * 120}  # it solves in a few updates
    cfg = _config(digit_model, env={"id": "srl.text.task:TextTask", "kwargs": kwargs}, stage={"worker": NAME}, run=run)
    actor_side = TextTask(**_config(digit_model).env.kwargs, num_envs=64)
    deferred = TextTask(**kwargs, num_envs=64)
    obs = actor_side.reset(0)
    prompts = list(actor_side.prompts)
    assert np.array_equal(deferred.reset(0)["obs"], obs["obs"])
    tok = actor_side.tokenizer
    vocab = [tok.convert_tokens_to_ids(d) for d in "0123456789"] + [actor_side.eos_id, actor_side.pad_id]
    tokens = np.random.default_rng(0).choice(vocab, (64, 4))  # digits, end-of-sequence and padding among them
    want = actor_side.step(tokens).reward
    assert not deferred.step(tokens).reward.any() and deferred.deferred_rewards
    stage = RewardStage(StageContext(0, {}, {}, cfg, lambda: -1))
    assert stage.task.prompt_texts(obs["obs"]) == prompts  # what a reward of the prompt would see
    segment = {"obs": obs["obs"][None], "actions": tokens[None], "rewards": np.full((1, 64), -1.0, np.float32)}
    assert stage.keep(segment) and want.std() > 0
    np.testing.assert_array_equal(segment["rewards"][0], want)
    np.testing.assert_array_equal(stage.episode_returns(), want)
    assert len(stage.episode_returns()) == 0  # each score reported once

    summary = train(cfg, tmp_path / "run", progress=None)
    assert summary["stop_reason"] == "solved" and summary["final_eval_return_mean"] >= 0.8, summary
    assert summary["episodes"] == summary["stages"]["stage0"]["stage_completions_scored"] > 0
    assert summary["stages"]["stage0"]["kept"] * 64 == summary["episodes"]

    with pytest.raises(ConfigError, match="env.kwargs.reward_on: stage goes with stage.worker"):
        from srl.runtime.plan import make_plan

        make_plan(_config(digit_model, env={"id": "srl.text.task:TextTask", "kwargs": kwargs}))
    with pytest.raises(ConfigError, match="env.kwargs.reward_on: expected actor or stage"):
        _task(digit_model, reward_on="nowhere")
