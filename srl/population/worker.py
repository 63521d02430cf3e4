"""The population worker: population-based training's manager, a worker of the run (as in SRL).

Actors send it, every report, each member's env steps and finished episodes' returns (one record per member on
its ``episodes`` channel). When a member has taken ``population.interval`` env steps since its last check and
finished enough episodes, it asks the exploit rule (:class:`~srl.population.state.PopulationState`); a member
that copies another is changed live, with no process restarted. The state travels by message, never through a
folder (on one machine a socket in the run's pipe folder, under Ray across nodes), as checkpoint bytes read with
weights only:

1. it asks the source's lead trainer (its command mailbox) to export: the trainer sends its algorithm's state
   (weights, optimizer state, observation and value normalizers; not its random streams) to the population's
   mailbox (:data:`INBOX`) at its next poll, between updates;
2. it hands that state and the new hyperparameter values to the target's lead trainer, which takes them (with
   its data-parallel peers at their next lockstep), drops the segments its columns collected with its old
   weights, publishes a new version (above its own, so versions never go back), writes a checkpoint and then
   says it took the copy.

A copy is under way until its target says so: an export or an import not answered within
:data:`ASK_AGAIN_SECONDS` is sent again (the trainer may have died with it; a copy it already took it only
acknowledges again). Its state (counters, values, scores, copies under way, the lineage) is
``RUN_DIR/population/state.json``, written atomically after every decision; a restarted worker reads it back
and asks for the exports of the copies under way again. The lineage is ``RUN_DIR/population.jsonl`` too, one
line per exploit and per explore.

The trainer's side is :class:`MemberLink`.
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
from srl.base.fileio import FULL, atomic_write_text, write_all
from srl.population.rules import ExploitRule
from srl.population.state import PopulationState
from srl.system.checkpoint import checkpoint_bytes, load_checkpoint_bytes
from srl.system.remote_records import Mailbox
from srl.system.streams import episode_sum

EXPORT, STATE, IMPORT, TAKEN = "export", "state", "import", "taken"
"""Messages: to a source's lead trainer (export your state for copy ``seq``), its answer to the population (the
state), to a target's lead trainer (take copy ``seq``: the state and its values), its answer (taken)."""
MAX_RECORDS = 1024
ASK_AGAIN_SECONDS = 5.0
"""An export or an import not answered after this long is sent again."""


class MemberLink:
    """A member's trainer's end of the population: the lead trainer answers the population worker's export and
    import messages between updates; every trainer of the member takes the copies.

    ``commands``: the lead's command mailbox (None for the member's other data-parallel trainers); ``inbox()``:
    opens the population's mailbox (when first written: under Ray its address is known once every server is
    up); ``member``: its index; ``settings(values)``: the algorithm's settings with those hyperparameter values
    (its typed section). A member of one trainer takes a copy as soon as it comes. Data-parallel trainers take it
    together: the lead notes it (:attr:`asked`), and at the lockstep before their next update every trainer learns
    the newest copy any was asked to take, the lead hands its state and values to the others over their
    collective, and all take it (:meth:`take`), so their weights and optimizer states stay equal."""

    def __init__(
        self,
        commands: Mailbox | None,
        inbox: Callable[[], Mailbox],
        member: int,
        settings: Callable[[Mapping[str, float]], Any],
    ) -> None:
        self.commands, self.member, self.settings = commands, member, settings
        self._open_inbox = inbox
        self._inbox: Mailbox | None = None
        self.values: dict[str, float] | None = None
        """The hyperparameter values it took last (None: its config's)."""
        self.taken = -1
        """The copy it took last, by its seq: the number of the decision that made it (``decision`` in
        ``population.jsonl``; ``population_copy`` in a checkpoint)."""
        self.asked = -1
        """The newest copy it was asked to take (and holds the state of, until it takes it)."""
        self._copy: tuple[dict[str, float], bytes] = ({}, b"")
        """The values and state of copy :attr:`asked`, until taken."""
        self.pause_max = 0.0
        """The longest a command kept its trainer from training (seconds): an export or an import."""

    def serve(self, trainer: Any) -> int:
        """Answer what came since the last call (a member of one trainer takes a copy now; data-parallel trainers
        at their next lockstep); how many messages."""
        if self.commands is None:  # a data-parallel peer: it takes copies at the lockstep only
            return 0
        messages = self.commands.recv(0.0)
        for meta, payload in messages:
            seq = int(meta["seq"])
            if meta["op"] == EXPORT:
                t0 = time.perf_counter()
                state = {k: v for k, v in trainer.algorithm.state_dict().items() if k != "rng"}
                self._send({"op": STATE, "seq": seq, "member": self.member}, checkpoint_bytes({"algorithm": state}))
                self.pause_max = max(self.pause_max, time.perf_counter() - t0)
            elif meta["op"] == IMPORT and seq <= self.taken:  # taken already (its answer was lost): say so again
                self._send({"op": TAKEN, "seq": seq, "member": self.member})
            elif meta["op"] == IMPORT and seq > self.asked:
                values = {str(k): float(v) for k, v in meta["values"].items()}
                self.asked, self._copy = seq, (values, payload)
        if trainer.collective is None and self.asked > self.taken:
            self.take(trainer, self.asked)
        return len(messages)

    def take(self, trainer: Any, seq: int) -> None:
        """Take copy ``seq``: its state and its member's new values (data-parallel trainers: from the lead, over
        their collective), then say so to the population."""
        t0 = time.perf_counter()
        values, payload = self._copy
        if trainer.collective is not None:  # the lead holds it; its peers take what it hands them
            text = trainer.collective.broadcast_bytes(json.dumps(values).encode())
            values, payload = json.loads(text), trainer.collective.broadcast_bytes(payload)
        state = load_checkpoint_bytes(payload, ("algorithm",), f"population copy {seq}")["algorithm"]
        self.values = {str(k): float(v) for k, v in values.items()}
        self.taken, self._copy = seq, ({}, b"")
        trainer.adopt(state, self.settings(self.values))  # its checkpoint holds the copy before it is acknowledged
        if self.commands is not None:
            self._send({"op": TAKEN, "seq": seq, "member": self.member})
        self.pause_max = max(self.pause_max, time.perf_counter() - t0)

    def checkpoint(self) -> dict[str, Any]:
        """What a checkpoint keeps of it: the values it trains with and the copy it took last."""
        return {} if self.values is None else {"hyperparameters": dict(self.values), "population_copy": self.taken}

    def restore(self, trainer: Any, state: Mapping[str, Any]) -> None:
        """A restarted trainer: take the values its checkpoint was written with (a copy it had not taken when it
        died is sent again: the population waits for its answer)."""
        values = state.get("hyperparameters")
        if values:
            self.values = {str(k): float(v) for k, v in values.items()}
            trainer.reconfigure(self.settings(self.values))
        self.taken = self.asked = int(state.get("population_copy", -1))

    def _send(self, meta: Mapping[str, Any], payload: bytes = b"") -> None:
        if self._inbox is None:
            self._inbox = self._open_inbox()
        self._inbox.send(meta, payload)


class PopulationWorker(Worker):
    """Scores members, decides copies, and drives them through the members' trainers."""

    def __init__(
        self,
        state: PopulationState,
        rule: ExploitRule,
        episodes: Channel,
        inbox: Mailbox,
        members: Sequence[Mailbox],
        run_dir: Path,
        reporter: Reporter,
        names: Sequence[str],
        wait_timeout: float = 0.05,
        evaluate: Callable[[int], Sequence[float]] | None = None,
    ) -> None:
        """``inbox``: its mailbox (the trainers' answers); ``members``: each member's lead trainer's command
        mailbox; ``names``: the members' policy names (their metrics' prefixes). ``evaluate(member)``: with
        ``score: eval``, the returns of the member's newest policy's deterministic episodes, played when it is
        due."""
        self.evaluate = evaluate
        self.state, self.rule, self.episodes, self.members = state, rule, episodes, list(members)
        self.inbox = inbox
        self.folder = run_dir / "population"
        self.lineage = run_dir / "population.jsonl"
        self.reporter, self.wait_timeout, self.names = reporter, wait_timeout, list(names)
        self.pending: dict[int, tuple[int, int, dict[str, float]]] = {}
        """Copies under way, until their target says it took them: seq -> (target, source, new values)."""
        self._states: dict[int, bytes] = {}  # seq -> the state its source exported, until its target took it
        self._sent: dict[int, float] = {}  # seq -> when its export or import was last sent
        self._unsaved = False  # a full disk refused the state or lineage lines: no decision until they are written
        self._said_full = False  # and the run was told

    def setup(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        saved = self.folder / "state.json"
        if saved.exists():  # a restart, or a resumed run: go on where it was
            data = json.loads(saved.read_text())
            self.state = PopulationState.from_json(self.state.cfg, data, str(saved), self.state.bases)
            self.pending = {int(k): (int(t), int(s), dict(v)) for k, (t, s, v) in data.get("pending", {}).items()}
            # the state's lineage is the record: a worker killed between the two writes left the file a line off
            atomic_write_text(self.lineage, "".join(json.dumps(r) + "\n" for r in self.state.lineage))
        for seq, (_, source, _) in self.pending.items():  # under way before a restart: ask for the state again
            self._ask(seq, source)
        self._report()

    def teardown(self) -> None:
        """The counters and windows since the last decision too: a resumed run goes on from them (on a disk still
        full, from the state written last)."""
        self._write_state()
        self._report()

    def poll(self) -> int:
        records = self.episodes.recv(MAX_RECORDS, 0.0 if self.pending else self.wait_timeout)
        for member, steps, n, hi, lo in records.tolist():
            if 0 <= member < len(self.members):
                self.state.add_steps(member, steps)
                if n > 0 and self.evaluate is None:  # scored by training episodes (else by evaluations)
                    self.state.add_window(member, episode_sum(hi, lo), n)
        answers = self.inbox.recv(min(self.wait_timeout, 0.005) if self.pending and not len(records) else 0.0)
        done = self._answered(answers)
        busy = {t for t, _, _ in self.pending.values()} | {s for _, s, _ in self.pending.values()}
        decided = 0
        for member in range(len(self.members)) if not self._unsaved or self._write_state() else ():
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
        self._again()
        if decided or done:
            self._write_state()
            self._report()
        return len(records) + len(answers) + decided

    def _answered(self, answers: list[tuple[dict[str, Any], bytes]]) -> int:
        """Hand each exported state to its copy's target; close each copy its target took. How many closed."""
        done = 0
        for meta, payload in answers:
            seq = int(meta.get("seq", -1))
            if seq not in self.pending:  # an answer to a copy closed already (sent twice)
                continue
            target, source, values = self.pending[seq]
            if meta.get("op") == STATE and meta.get("member") == source:
                self._states[seq] = payload
                self._send(target, {"op": IMPORT, "seq": seq, "source": source, "values": values}, payload)
            elif meta.get("op") == TAKEN and meta.get("member") == target:
                del self.pending[seq]
                self._states.pop(seq, None)
                self._sent.pop(seq, None)
                done += 1
        return done

    def _again(self) -> None:
        """Send again what was not answered in time: an export, or an import (a trainer may have died with it)."""
        now = time.monotonic()
        for seq, (target, source, values) in self.pending.items():
            if now - self._sent.get(seq, 0.0) <= ASK_AGAIN_SECONDS:
                continue
            if seq in self._states:
                self._send(target, {"op": IMPORT, "seq": seq, "source": source, "values": values}, self._states[seq])
            else:
                self._ask(seq, source)

    def _ask(self, seq: int, source: int) -> None:
        self._send(source, {"op": EXPORT, "seq": seq})

    def _send(self, member: int, meta: Mapping[str, Any], payload: bytes = b"") -> None:
        self.members[member].send(meta, payload)
        self._sent[int(meta["seq"])] = time.monotonic()

    def _append(self, records: list[dict[str, Any]]) -> None:
        """The decision's lines at the end of the lineage file; on a full disk, written from the state later."""
        try:
            with self.lineage.open("ab", buffering=0) as f:
                write_all(f, "".join(json.dumps(r) + "\n" for r in records).encode())
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            self._unsaved = True

    def _write_state(self) -> bool:
        """``state.json`` (and, after lines a full disk refused, the lineage from the state, which is its record);
        False while the disk is full, and one warning, and one more once it is written again."""
        try:
            if self._unsaved:
                atomic_write_text(self.lineage, "".join(json.dumps(r) + "\n" for r in self.state.lineage))
            self._save()
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            if not self._said_full:
                message = f"state not saved ({exc.strerror}): no exploit decisions until it is"
                self.reporter.report("info", {"message": message})
            self._unsaved = self._said_full = True
            return False
        if self._said_full:
            self.reporter.report("info", {"message": "state saved again: decisions go on"})
        self._unsaved = self._said_full = False
        return True

    def _save(self) -> None:
        data = self.state.to_json()
        data["pending"] = {str(k): list(v) for k, v in self.pending.items()}
        atomic_write_text(self.folder / "state.json", json.dumps(data))

    def _report(self) -> None:
        # copies: the exploit lines of population.jsonl (from the state, so a restart keeps counting), of which
        # copies_under_way their target had not said it took yet (its CPU time is the run's cost, per role)
        meta: dict[str, Any] = {
            "copies": self.state.copies(),
            "copies_under_way": len(self.pending),
            "decisions": self.state.decisions,
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
