"""The inline runtime: every worker in this process, polled in turn. Deterministic given the seed."""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import torch

from srl.runtime.build import build_worker
from srl.runtime.fabric import InlineFabric, newest_snapshots
from srl.runtime.plan import Plan
from srl.system.controller import Controller, stop_on_signals
from srl.system.tracebacks import error_line


def run_inline(plan: Plan, controller: Controller, run_dir: Path | None) -> list[np.ndarray] | None:
    """Run until the controller says stop (or Ctrl-C); return the newest policy snapshot.

    A signal lets the worker in progress finish its poll; the loop then ends, and teardown runs (see
    :func:`~srl.system.controller.stop_on_signals`).
    """
    torch.set_num_threads(plan.cfg.workers.torch_threads)  # every worker runs on this thread
    fabric = InlineFabric(plan, controller.handle)
    workers = []
    current = "setup"
    with stop_on_signals(controller):
        try:
            for spec in plan.topology.workers:
                current = spec.name
                worker = build_worker(plan, fabric, spec, run_dir, wait_timeout=0.0, report_interval=0.0)
                worker.should_stop = lambda: controller.should_stop() is not None
                worker.setup()
                workers.append(worker)
            while controller.should_stop() is None:
                for worker in workers:
                    current = worker.name
                    worker.poll()
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
