"""The sweep's best and each tune's pick, by samples trained per second.

    python docs/data/tune/summarize.py cartpole halfcheetah pong
"""
import json, sys
from pathlib import Path
D = Path(__file__).parent
for env in sys.argv[1:]:
    rows = [json.loads(l) for l in (D / f"sweep_{env}.jsonl").read_text().splitlines() if l.strip()]
    by = {tuple(d["set"]): d for d in rows}
    best = max(rows, key=lambda d: d["trained_samples_per_second"])
    sweep_seconds = max(d["wall"] for d in rows)
    print(f"{env}: {len(rows)} layouts, best {' '.join(best['set'])}: {best['trained_samples_per_second']:.0f} trained/s ({best['train_fps']:.0f} sampled)")
    top = sorted(rows, key=lambda d: -d["trained_samples_per_second"])[:5]
    for d in top:
        print("   top", " ".join(s.split("=")[1] for s in d["set"]), d["trained_samples_per_second"], d["train_fps"])
    tf = D / f"tune_{env}.jsonl"
    if tf.exists():
        for i, l in enumerate(tf.read_text().splitlines(), 1):
            t = json.loads(l)
            b = tuple(t["best"])
            secs = (D / f"tune_{env}_seconds.txt").read_text().split()[i - 1]  # wall seconds of each srl tune
            print(f"  tune {i} ({secs} s): {' '.join(s.split('=')[1] for s in b)} measured {t['best_trained_samples_per_second']:.0f}; "
                  f"sweep {by[b]['trained_samples_per_second']:.0f} = {by[b]['trained_samples_per_second'] / best['trained_samples_per_second']:.3f} of best")
            for x in t["tried"]:
                print("     ", " ".join(s.split("=")[1] for s in x["set"]), x["trained_samples_per_second"], "pred", x["predicted_steps_per_second"], "rank", x["model_rank"])
