"""The inline runtime: every worker in this process, polled in turn. Deterministic given the seed."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType

import numpy as np
import torch

from srl.runtime.build import build_worker
from srl.runtime.fabric import InlineFabric, newest_snapshots
from srl.runtime.plan import Plan
from srl.system.controller import Controller

log = logging.getLogger(__name__)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def run_inline(plan: Plan, controller: Controller, run_dir: Path | None) -> list[np.ndarray] | None:
    """Run until the controller says stop (or Ctrl-C); return the newest policy snapshot."""
    torch.set_num_threads(plan.cfg.workers.torch_threads)  # every worker runs on this thread
    fabric = InlineFabric(plan, controller.handle)
    workers = []
    current = "setup"
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in signals} if _main_thread() else {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # The first Ctrl-C or SIGTERM asks for the same clean stop as the local runtime's: the loop ends after the
        # worker it is in (teardown, final checkpoint, summary). Raising from here instead could land inside any
        # import or write in progress and leave it half done. A second signal stops waiting.
        if controller.stop_reason == "interrupted":
            raise KeyboardInterrupt
        controller.stop_reason = controller.stop_reason or "interrupted"

    for sig in previous:
        signal.signal(sig, on_signal)
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
    except Exception as exc:  # a failing worker ends the run with one line naming it, as in the local runtime
        log.debug("worker %s failed", current, exc_info=True)
        controller.fail(f"{current}: {type(exc).__name__}: {exc}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for worker in reversed(workers):
            try:
                worker.teardown()
            except Exception as exc:  # e.g. the final checkpoint could not be written: one line, the rest still close
                log.debug("worker %s failed in teardown", worker.name, exc_info=True)
                controller.fail(f"{worker.name}: {type(exc).__name__}: {exc}")
    return newest_snapshots(fabric)
