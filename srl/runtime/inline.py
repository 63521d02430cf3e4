"""The inline runtime: every worker in this process, polled in turn. Deterministic given the seed.

A trainer updates only after a round of polls in which no worker could do anything: the actors have filled
every sample buffer they may, and the next batch waits queued. That is the order the local and Ray runtimes
take when the trainer binds, as it does on CPU: actors act on while an update runs, so each batch was collected
by a policy two versions older than the one it trains (with ``workers.sample_buffers`` at its default of
``ring_size + 2``). Polling the trainer as soon as its batch is full would train every batch on the newest
policy instead, and PPO learns differently at lag 0 (measured in docs/benchmarks.md, "the inline and the local
runtime learn alike"). So the runtimes learn alike, and a bug seen under ``runtime: local`` shows here too.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import numpy as np
import torch

from srl.runtime.build import build_worker
from srl.runtime.fabric import InlineFabric, newest_snapshots
from srl.runtime.plan import Plan
from srl.runtime.topology import attach_reports
from srl.system.controller import Controller, stop_on_signals
from srl.system.tracebacks import error_line
from srl.system.trainer_worker import TrainerWorker


def run_inline(plan: Plan, controller: Controller, run_dir: Path | None) -> list[np.ndarray] | None:
    """Run until the controller says stop (or Ctrl-C); return the newest policy snapshot.

    A signal lets the worker in progress finish its poll; the loop then ends, and teardown runs (see
    :func:`~srl.system.controller.stop_on_signals`).
    """
    torch.set_num_threads(plan.cfg.workers.torch_threads)  # every worker runs on this thread
    attach_reports(plan.topology, controller)
    fabric = InlineFabric(plan, controller.handle)
    workers = []
    current = "setup"
    with stop_on_signals(controller):
        try:
            quiet = False  # the last round: no worker did anything (the trainers' hold reads it as it changes)
            for spec in plan.topology.workers:
                current = spec.name
                worker = build_worker(plan, fabric, spec, run_dir, wait_timeout=0.0, report_interval=0.0)
                worker.should_stop = lambda: controller.should_stop() is not None
                if isinstance(worker, TrainerWorker):
                    worker.hold = lambda: not quiet
                began = time.process_time()
                worker.setup()
                controller.cost.charge(worker.name, time.process_time() - began)
                workers.append(worker)
            while controller.should_stop() is None:
                done, cost, clock = 0, controller.cost, time.process_time()
                for worker in workers:
                    current = worker.name
                    done += worker.poll()
                    clock, before = time.process_time(), clock
                    cost.charge(worker.name, clock - before)  # each worker its polls' CPU
                quiet = done == 0
                controller.tick()
        except KeyboardInterrupt:
            controller.stop_reason = "interrupted"
        except Exception as exc:
            _failed(controller, current, exc)
        finally:
            for worker in reversed(workers):
                try:
                    worker.teardown()
                except Exception as exc:  # e.g. the final checkpoint was not written: the rest still close
                    _failed(controller, worker.name, exc)
    return newest_snapshots(fabric)


def _failed(controller: Controller, worker: str, exc: Exception) -> None:
    """A worker failed: the run ends with one line naming it, and its whole traceback is printed (this is the
    runtime for debugging: srl's frames included)."""
    controller.worker_failed(worker, error_line(exc), "".join(traceback.format_exception(exc)))
