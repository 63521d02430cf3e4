#!/usr/bin/env bash
# One command for a lent GPU machine (issue 41, part 2), in under 9 minutes: use this working tree (and the wheels
# in .whl/, which scripts/gpu_wheels.sh fetches, for what the machine lacks); run the CUDA tests; measure the device
# (srl bench compute, float32 and bfloat16); train Pong on it for 6 minutes; run configs/rlhf_preference.yaml on it
# for 90 s. Every log and summary.json go to $OUT (what the device tool brings back), at most 7 files.
#
#   scripts/gpu_check.sh [DEVICE]        DEVICE: cuda (default; or $SRL_DEVICE), cuda:N, or cpu for a rehearsal
#
# Budgets in seconds: PONG_SECONDS (360), RLHF_SECONDS (90), BENCH_SECONDS (4), TOTAL_SECONDS (540: no step runs
# past it; Pong leaves the RLHF run its time and 30 s more). Pong's layout: PONG_ACTORS actors (the cores but 4, at least 1) of
# 2 slots of 8 envs, the policy worker and the trainer on DEVICE. PONG_SET, RLHF_SET: more overrides (KEY=VALUE
# ...). MODELS (models): the folder of the RLHF base and reward models; when they are missing they are made there
# first, on 2 CPU threads while Pong trains (RLHF_PREP: overrides for making them). The rehearsal on the CPU:
#
#   OUT=/tmp/gpu_rehearsal MODELS=/tmp/gpu_rehearsal_models PONG_SECONDS=20 RLHF_SECONDS=15 BENCH_SECONDS=2 \
#   RLHF_PREP="text.base.steps=20 text.reward_model.pairs=64 text.reward_model.steps=5" scripts/gpu_check.sh cpu
set -uo pipefail

DEVICE=${1:-${SRL_DEVICE:-cuda}}
OUT=${OUT:-gpu_check_out}
PY=${PYTHON:-python3}
PONG_SECONDS=${PONG_SECONDS:-360}
RLHF_SECONDS=${RLHF_SECONDS:-90}
BENCH_SECONDS=${BENCH_SECONDS:-4}
TOTAL_SECONDS=${TOTAL_SECONDS:-540}
CORES=$(nproc)
PONG_ACTORS=${PONG_ACTORS:-$((CORES > 5 ? CORES - 4 : 1))}
MODELS=${MODELS:-models}
RUNS=$(mktemp -d /tmp/srl-gpu-check-XXXXXX)
START=$(date +%s)
mkdir -p "$OUT"

left() { echo $((TOTAL_SECONDS - ($(date +%s) - START))); }

sets() { for kv in "$@"; do printf -- '--set\n%s\n' "$kv"; done; }  # KEY=VALUE ... as --set arguments

step() {  # step NAME LIMIT CMD...: run CMD for at most LIMIT seconds (never past TOTAL_SECONDS), and record it
    local name=$1 limit=$2
    shift 2
    local most
    most=$(left)
    ((limit > most)) && limit=$most
    local t0 rc
    t0=$(date +%s)
    if ((limit <= 0)); then
        rc=124
        echo "== $name: skipped, no time left" >&2
    else
        echo "== $name (at most ${limit} s): $*" >&2
        timeout --signal=INT --kill-after=30 "$limit" "$@"  # SIGINT: a run stops cleanly and writes its summary
        rc=$?
    fi
    echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(($(date +%s) - t0))}" >>"$RUNS/steps.jsonl"
    echo "== $name: exit $rc after $(($(date +%s) - t0)) s" >&2  # stdout may be a step's result file
    return $rc
}

model_paths() {  # the RLHF config's model folders, under $MODELS (KEY=VALUE lines)
    printf '%s\n' "text.model=$MODELS/pydoc_lm" "env.kwargs.tokenizer=$MODELS/pydoc_lm" \
        "text.reward_model.folder=$MODELS/pydoc_rm" "env.kwargs.reward_args.folder=$MODELS/pydoc_rm"
}

main() {
    echo "== gpu_check: device $DEVICE, $CORES cores, out $OUT, runs in $RUNS, $(date -u +%FT%TZ)"
    export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
    if compgen -G ".whl/*.whl" >/dev/null; then
        step install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$RUNS/site" .whl/*.whl && export PYTHONPATH=$RUNS/site:$PWD
    fi
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    "$PY" - "$DEVICE" >"$RUNS/env.json" <<'EOF'
import importlib, json, platform, sys
import torch
device = sys.argv[1]
found = {}
for name in ("gymnasium", "ale_py", "zmq", "transformers", "numpy"):
    try:
        found[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:  # a missing package is reported, and the steps that need it fail on their own
        found[name] = f"missing: {exc}"
cuda = torch.cuda.is_available()
print(json.dumps({
    "device": device, "python": platform.python_version(), "torch": torch.__version__, "cuda": cuda,
    "gpu": torch.cuda.get_device_name(0) if cuda else None, "packages": found,
}))
EOF
    cat "$RUNS/env.json"

    # the RLHF models, when missing: made on the CPU beside everything else, before the RLHF run needs them
    local prep=""
    if [[ ! -d $MODELS/pydoc_lm || ! -d $MODELS/pydoc_rm ]]; then
        echo "== models: making $MODELS/pydoc_lm and $MODELS/pydoc_rm in the background"
        mapfile -t made < <(model_paths; printf '%s\n' ${RLHF_PREP:-})
        (
            OMP_NUM_THREADS=${PREP_THREADS:-2} "$PY" -c '
import sys
from srl.api.config import load_config
from srl.wiring import prepare_algorithm
prepare_algorithm(load_config("configs/rlhf_preference.yaml", sys.argv[1:]))
' "${made[@]}" >"$RUNS/models.log" 2>&1
            echo $? >"$RUNS/models.rc"
        ) &
        prep=$!
    fi

    step cuda_tests 150 "$PY" -m pytest -q -n 0 -p no:cacheprovider -rs --junitxml="$RUNS/tests.xml" tests/test_gpu.py

    : >"$OUT/bench_compute.jsonl"
    for dtype in float32 bfloat16; do
        step "bench_compute_$dtype" $((BENCH_SECONDS + 60)) "$PY" -m srl.cli.main bench compute \
            --config configs/pong_ppo.yaml --device "$DEVICE" --seconds "$BENCH_SECONDS" --json \
            --set "workers.trainer_dtype=$dtype" >>"$OUT/bench_compute.jsonl"
        tail -n 1 "$OUT/bench_compute.jsonl"
    done

    mapfile -t pong < <(sets "workers.trainer_device=$DEVICE" "workers.policy_device=$DEVICE" \
        "workers.actors=$PONG_ACTORS" workers.ring_size=2 workers.envs_per_slot=8 "workers.batch_segments=$PONG_ACTORS" \
        "run.max_train_seconds=$PONG_SECONDS" run.eval_episodes=0 run.tensorboard=false ${PONG_SET:-})
    local limit=$(($(left) - RLHF_SECONDS - 30))  # the RLHF run's time stays free
    ((limit > PONG_SECONDS + 45)) && limit=$((PONG_SECONDS + 45))
    step pong "$limit" "$PY" -m srl.cli.main train configs/pong_ppo.yaml --run-dir "$RUNS/pong" "${pong[@]}"

    if [[ -n $prep ]]; then
        echo "== models: waiting for them"
        wait "$prep"
        cat "$RUNS/models.log"
        echo "{\"step\": \"models\", \"rc\": $(cat "$RUNS/models.rc" 2>/dev/null || echo 1), \"seconds\": null}" \
            >>"$RUNS/steps.jsonl"
    fi
    mapfile -t rlhf < <(sets $(model_paths) "workers.trainer_device=$DEVICE" "workers.policy_device=$DEVICE" \
        "run.max_train_seconds=$RLHF_SECONDS" run.eval_initial=false run.eval_episodes=64 run.tensorboard=false \
        ${RLHF_SET:-})
    step rlhf $((RLHF_SECONDS + 60)) "$PY" -m srl.cli.main train configs/rlhf_preference.yaml \
        --run-dir "$RUNS/rlhf" "${rlhf[@]}"

    for run in pong rlhf; do
        cp "$RUNS/$run/summary.json" "$OUT/${run}_summary.json" 2>/dev/null
        cp "$RUNS/$run/metrics.jsonl" "$OUT/${run}_metrics.jsonl" 2>/dev/null
    done
    "$PY" - "$RUNS" "$OUT" "$START" <<'EOF'
import json, sys, time
import xml.etree.ElementTree as ET
from pathlib import Path

runs, out, start = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])


def read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


steps = [json.loads(line) for line in (runs / "steps.jsonl").read_text().splitlines()]
tests = None
if (runs / "tests.xml").exists():
    suite = ET.parse(runs / "tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    tests = {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]}
bench = [json.loads(line) for line in (out / "bench_compute.jsonl").read_text().splitlines() if line.startswith("{")]
keep = ("env_steps", "wall_seconds", "train_fps", "trained_samples_per_second", "policy_version", "return_mean",
        "final_eval_return_mean", "stop_reason", "time_fractions", "lag_mean")
runs_out = {}
for run in ("pong", "rlhf"):
    summary = read(out / f"{run}_summary.json")
    runs_out[run] = None if summary is None else {k: summary[k] for k in keep if k in summary}
    metrics = out / f"{run}_metrics.jsonl"
    if summary is not None and metrics.exists():
        lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        last = lines[-1] if lines else {}
        runs_out[run]["last_metrics"] = {k: v for k, v in last.items() if not isinstance(v, (list, dict))}
ok = all(s["rc"] == 0 for s in steps) and tests is not None and tests["failures"] + tests["errors"] == 0
ok = ok and all(runs_out[r] is not None for r in runs_out) and len(bench) == 2
summary = {"ok": ok, "total_seconds": round(time.time() - start, 1), "env": read(runs / "env.json"),
           "steps": steps, "tests": tests, "bench_compute": bench, **runs_out}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps({"ok": ok, "total_seconds": summary["total_seconds"], "tests": tests,
                  "steps": {s["step"]: s["rc"] for s in steps}}))
sys.exit(0 if ok else 1)
EOF
}

main "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
