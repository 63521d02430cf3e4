"""The population worker: population-based training's manager, a worker of the run (as in SRL).

Actors send it, every report, each member's env steps and finished episodes' returns (one record per member on
its ``episodes`` channel). When a member has taken ``population.interval`` env steps since its last check and
finished enough episodes, it asks the exploit rule (:class:`~srl.population.state.PopulationState`); a member
that copies another is changed live, with no process restarted:

1. it asks the source's trainer to export its state (:data:`EXPORT`): the trainer writes its algorithm's state
   (weights, optimizer state, observation and value normalizers; not its random streams) to
   ``RUN_DIR/population/transfer/state_<seq>.pt`` at its next poll, between updates;
2. once that file is there, it writes the command (source, new hyperparameter values) to ``command_<seq>.json``
   and asks the target's trainer to import it (:data:`IMPORT`): the trainer loads the state, takes the new
   values, drops the segments its columns collected with its old weights, publishes a new version (above its
   own, so versions never go back) and writes a checkpoint.

Its state (counters, values, scores, pending copies, the lineage) is ``RUN_DIR/population/state.json``, written
atomically after every decision; a restarted worker reads it back and re-sends what was pending. The lineage is
``RUN_DIR/population.jsonl`` too, one line per exploit and per explore.

The trainer's side is :class:`MemberLink`. Both ends talk through node-local channels of integer records (pipes,
or queues inline) and the run directory.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from srl.api.report import RunFacts
from srl.api.worker import Reporter, Worker
from srl.base.channel import Channel
from srl.base.fileio import atomic_write_text
from srl.population.rules import ExploitRule
from srl.population.state import PopulationState
from srl.system.checkpoint import load_checkpoint, save_checkpoint
from srl.system.streams import episode_sum

EXPORT, IMPORT = 1, 2
"""Commands to a member's lead trainer: write your state for copy ``seq``; take copy ``seq``'s state and values."""
MAX_RECORDS = 1024
ASK_AGAIN_SECONDS = 5.0
"""An export not written after this long is asked for again (the source's trainer may have died with the
request); exports overwrite, so a second one costs only its time."""


def folders(run_dir: Path) -> tuple[Path, Path]:
    """The population's folder in ``run_dir`` and the transfer folder inside it."""
    return run_dir / "population", run_dir / "population" / "transfer"


def _save_state(path: Path, state: Mapping[str, Any]) -> None:
    """A member's exported algorithm state, as a checkpoint of its own (``srl.system.checkpoint``)."""
    save_checkpoint(path, {"algorithm": dict(state)})


class MemberLink:
    """A member's trainer's end of the population: the lead trainer serves the population worker's export and
    import commands between updates; every trainer of the member takes the copies.

    ``channel``: the lead's command channel (None for the member's other data-parallel trainers); ``member``: its
    index; ``settings(values)``: the algorithm's settings with those hyperparameter values (its typed section).
    A member of one trainer takes a copy as soon as it is asked to. Data-parallel trainers take it together: the
    lead notes it (:attr:`asked`), and at the lockstep before their next update every trainer learns the newest
    copy any was asked to take and takes it from the run directory (:meth:`take`), so their weights and
    optimizer states stay equal. A trainer killed after it took an import command but before it applied it would
    lose the copy: a restarted one (:meth:`restore`) takes the newest copy addressed to its member that its
    checkpoint has not."""

    def __init__(
        self, channel: Channel | None, run_dir: Path, member: int, settings: Callable[[Mapping[str, float]], Any]
    ) -> None:
        self.channel, self.member, self.settings = channel, member, settings
        self.folder = folders(run_dir)[1]
        self.values: dict[str, float] | None = None
        """The hyperparameter values it took last (None: its config's)."""
        self.taken = -1
        """The copy it took last, by its seq: the number of the decision that made it (``decision`` in
        ``population.jsonl``; ``population_copy`` in a checkpoint)."""
        self.asked = -1
        """The newest copy it was asked to take (by a command, or found at a restart)."""
        self.pause_max = 0.0
        """The longest a command kept its trainer from training (seconds): an export or an import."""

    def serve(self, trainer: Any) -> int:
        """Carry out what was asked since the last call (a member of one trainer takes a copy now; data-parallel
        trainers at their next lockstep); how many commands."""
        if self.channel is None:  # a data-parallel peer: it takes copies at the lockstep only
            return 0
        records = self.channel.recv(16, 0.0)
        for op, seq, _source, _ in records.tolist():
            if op == EXPORT:
                t0 = time.perf_counter()
                state = {k: v for k, v in trainer.algorithm.state_dict().items() if k != "rng"}
                self.folder.mkdir(parents=True, exist_ok=True)
                _save_state(self.folder / f"state_{seq}.pt", state)
                self.pause_max = max(self.pause_max, time.perf_counter() - t0)
            elif op == IMPORT:
                self.asked = max(self.asked, seq)
        if trainer.collective is None and self.asked > self.taken:
            self.take(trainer, self.asked)
        return len(records)

    def take(self, trainer: Any, seq: int) -> None:
        """Take copy ``seq``: its state and its member's new values, from the run directory."""
        t0 = time.perf_counter()
        exported = self.folder / f"state_{seq}.pt"
        try:
            command = json.loads((self.folder / f"command_{seq}.json").read_text())
            state = load_checkpoint(exported, ("algorithm",))["algorithm"]
        except (FileNotFoundError, ValueError):
            if exported.exists():  # a damaged file: one line naming it
                raise
            self.taken = seq  # pruned just now: a newer copy to this member supersedes it
            return
        self.values = {str(k): float(v) for k, v in command["values"].items()}
        self.taken = seq
        trainer.adopt(state, self.settings(self.values))
        self.pause_max = max(self.pause_max, time.perf_counter() - t0)

    def checkpoint(self) -> dict[str, Any]:
        """What a checkpoint keeps of it: the values it trains with and the copy it took last."""
        return {} if self.values is None else {"hyperparameters": dict(self.values), "population_copy": self.taken}

    def restore(self, trainer: Any, state: Mapping[str, Any]) -> None:
        """A restarted trainer: take the values its checkpoint was written with, and a newer copy addressed to it
        at its first poll."""
        values = state.get("hyperparameters")
        if values:
            self.values = {str(k): float(v) for k, v in values.items()}
            trainer.reconfigure(self.settings(self.values))
        self.taken = int(state.get("population_copy", -1))
        mine = [seq for seq, target in _commands(self.folder) if target == self.member and seq > self.taken]
        self.asked = max(mine, default=-1)


def _commands(folder: Path) -> list[tuple[int, int]]:
    """(seq, target) of every copy command written to ``folder`` whose state is there too."""
    out = []
    for path in folder.glob("command_*.json") if folder.exists() else []:
        seq = int(path.stem.partition("_")[2])
        if (folder / f"state_{seq}.pt").exists():
            out.append((seq, int(json.loads(path.read_text())["target"])))
    return out


class PopulationWorker(Worker):
    """Scores members, decides copies, and drives them through the members' trainers."""

    def __init__(
        self,
        state: PopulationState,
        rule: ExploitRule,
        episodes: Channel,
        members: Sequence[Channel],
        run_dir: Path,
        reporter: Reporter,
        names: Sequence[str],
        wait_timeout: float = 0.05,
        evaluate: Callable[[int], Sequence[float]] | None = None,
    ) -> None:
        """``names``: the members' policy names (their metrics' prefixes). ``evaluate(member)``: with ``score:
        eval``, the returns of the member's newest policy's deterministic episodes, played when it is due."""
        self.name = "population0"
        self.evaluate = evaluate
        self.state, self.rule, self.episodes, self.members = state, rule, episodes, list(members)
        self.folder, self.transfer = folders(run_dir)
        self.lineage = run_dir / "population.jsonl"
        self.reporter, self.wait_timeout, self.names = reporter, wait_timeout, list(names)
        self.pending: dict[int, tuple[int, int, dict[str, float]]] = {}
        """Copies under way: seq -> (target, source, new values)."""
        self._asked: dict[int, float] = {}  # seq -> when its export was last asked for

    def setup(self) -> None:
        self.transfer.mkdir(parents=True, exist_ok=True)
        saved = self.folder / "state.json"
        if saved.exists():  # a restart, or a resumed run: go on where it was
            data = json.loads(saved.read_text())
            self.state = PopulationState.from_json(self.state.cfg, data, str(saved), self.state.bases)
            self.pending = {int(k): (int(t), int(s), dict(v)) for k, (t, s, v) in data.get("pending", {}).items()}
            # the state's lineage is the record: a worker killed between the two writes left the file a line off
            atomic_write_text(self.lineage, "".join(json.dumps(r) + "\n" for r in self.state.lineage))
        for seq, (_, source, _) in self.pending.items():  # asked before a restart: ask again (exports overwrite)
            self._ask(seq, source)
        self._report()

    def teardown(self) -> None:
        """The counters and windows since the last decision too: a resumed run goes on from them."""
        self._save()
        self._report()

    def poll(self) -> int:
        records = self.episodes.recv(MAX_RECORDS, 0.0 if self.pending else self.wait_timeout)
        for member, steps, n, hi, lo in records.tolist():
            if 0 <= member < len(self.members):
                self.state.add_steps(member, steps)
                if n > 0 and self.evaluate is None:  # scored by training episodes (else by evaluations)
                    self.state.add_window(member, episode_sum(hi, lo), n)
        done = self._finish_copies()
        busy = {t for t, _, _ in self.pending.values()} | {s for _, s, _ in self.pending.values()}
        decided = 0
        for member in range(len(self.members)):
            if self.evaluate is not None and member not in busy and self.state.due(member):
                self.state.evaluated(member, self.evaluate(member))
            if member not in busy and self.state.ready(member):
                decision = self.state.check(member, self.rule, barred=busy)
                decided += 1
                if decision.source is not None:
                    seq = decision.seq
                    self.pending[seq] = (member, decision.source, decision.new)
                    busy |= {member, decision.source}
                    self._append(decision.records())
                    self._ask(seq, decision.source)
        if decided or done:
            self._save()
            self._report()
        if not len(records) and not decided and not done and self.pending:
            time.sleep(min(self.wait_timeout, 0.005))  # an export is being written
        return len(records) + decided + done

    def _finish_copies(self) -> int:
        """Each copy whose source has exported: hand it to its target."""
        done = 0
        for seq, (target, source, values) in list(self.pending.items()):
            if not (self.transfer / f"state_{seq}.pt").exists():
                if time.monotonic() - self._asked.get(seq, 0.0) > ASK_AGAIN_SECONDS:
                    self._ask(seq, source)
                continue
            command = {"source": source, "target": target, "values": values}
            atomic_write_text(self.transfer / f"command_{seq}.json", json.dumps(command))
            self._send(target, IMPORT, seq, source)
            del self.pending[seq]
            self._asked.pop(seq, None)
            self._prune(target, seq)
            done += 1
        return done

    def _ask(self, seq: int, source: int) -> None:
        self._send(source, EXPORT, seq, source)
        self._asked[seq] = time.monotonic()

    def _prune(self, target: int, newest: int) -> None:
        """The files of ``target``'s earlier copies: the newest one supersedes them (a trainer that has not taken
        one yet takes the newest instead)."""
        for path in self.transfer.glob("command_*.json"):
            seq = int(path.stem.partition("_")[2])
            if seq < newest and json.loads(path.read_text()).get("target") == target:
                (self.transfer / f"state_{seq}.pt").unlink(missing_ok=True)
                path.unlink(missing_ok=True)

    def _send(self, member: int, op: int, seq: int, source: int) -> None:
        self.members[member].send((op, seq, source, 0))

    def _append(self, records: list[dict[str, Any]]) -> None:
        with self.lineage.open("a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    def _save(self) -> None:
        data = self.state.to_json()
        data["pending"] = {str(k): list(v) for k, v in self.pending.items()}
        atomic_write_text(self.folder / "state.json", json.dumps(data))

    def _report(self) -> None:
        # its process's CPU time (under the local and Ray runtimes its own: what the run would save without it)
        # copies: the exploit lines of population.jsonl (from the state, so a restart keeps counting), of which
        # copies_under_way had not reached their target yet (their source's state not yet written)
        meta: dict[str, Any] = {
            "copies": self.state.copies(),
            "copies_under_way": len(self.pending),
            "decisions": self.state.decisions,
            "cpu_seconds": time.process_time(),
        }
        for name, (i, m) in zip(self.names, enumerate(self.state.members)):
            meta.update({f"{name}/{k}": v for k, v in m.values.items()})
            score = self.state.score(i)
            if score is not None:
                meta[f"{name}/score"] = score
        self.reporter.report("population", meta)


class PopulationReports:
    """The population worker's reports (the :class:`~srl.api.report.Aggregator` of their kind): its newest counts
    and each member's values and score (``population_copies``, ``member1/ppo.lr``) in the records, and as
    ``population`` in ``summary.json``. Its members are alternatives, so the run's target is held against the
    best member's window of episodes."""

    def __init__(self, facts: RunFacts) -> None:
        facts.solve_by_best_policy()
        self.newest: dict[str, Any] = {}

    def handle(self, worker: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        self.newest = {k: v for k, v in meta.items() if k != "worker"}

    def record(self) -> dict[str, float]:
        return {k if "/" in k else f"population_{k}": float(v) for k, v in self.newest.items()}

    def summary(self) -> dict[str, Any]:
        return {"population": dict(self.newest)} if self.newest else {}

    def final(self, final_eval: Mapping[str, Any]) -> dict[str, Any]:
        """The member the final evaluation found best (what ``srl.load_policy`` and ``srl eval`` load)."""
        return {"population": {"best": final_eval["best"]}} if "best" in final_eval else {}

    def restarted(self, worker: str) -> None:
        pass
