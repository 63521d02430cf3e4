"""``srl bench params``: what the root of the parameter service sends per version, flat vs hierarchical.

One process per server and per reader on this machine, joined by ipc
sockets and shared memory exactly as in the local runtime: a publisher (this
process) writes a new snapshot every ``interval`` seconds into the root
buffer; the root server serves it; in hierarchical mode one relay per group
of ``per_group`` readers mirrors it into the group's shared buffer (a relay
tree of ``fan_out``); in flat mode every reader subscribes to the root. We
record the root's sends and bytes per version and, per version, the time until
the last reader holds it.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import zmq

from srl.base import transfer
from srl.base.seqlock import VersionedBuffer
from srl.base.shm import ShmArray, new_tag
from srl.system.param_service import ParamServiceWorker, RemoteSnapshot, relay_parent

TOKEN_BYTES = 16
MAX_CELLS = 1 << 16
"""Arrival-time table size: readers x versions."""


class _NoReports:
    def report(self, kind: str, meta: Any, arrays: Any = None) -> None:
        pass


def _service(
    tag: str,
    folder: str,
    name: str,
    group: int,
    groups: int,
    fan_out: int,
    size: int,
    token: str,
    dtype: str,
    slot: int,
) -> None:
    """A server process (the root, or relay ``group``); writes its send counters into the shared table."""
    ctx = zmq.Context()
    stop = ShmArray.attach(f"{tag}_stop", (1,), "int32")
    counters = ShmArray.attach(f"{tag}_cnt", (groups + 1, 2), "int64")
    try:
        if name == "root":
            source: Any = VersionedBuffer.attach_shared(f"{tag}_root", size, np.float32)
            mirror = None
        else:
            source = RemoteSnapshot(ctx, f"ipc://{folder}/{relay_parent(group, fan_out)}", size, token, dtype)
            mirror = VersionedBuffer.attach_shared(f"{tag}_g{group}", size, np.float32)
        serves = name == "root" or any(relay_parent(g, fan_out) == name for g in range(groups))
        worker = ParamServiceWorker(
            name,
            source,
            size,
            _NoReports(),
            f"ipc://{folder}/{name}" if serves else None,
            token,
            mirror=mirror,
            transfer_dtype=dtype,
            wait_timeout=0.01,
            ctx=ctx,
        )
        worker.run(lambda: bool(stop.array[0]))
        if worker.server is not None:
            counters.array[slot] = (worker.server.sends, worker.server.bytes_sent)
    finally:
        stop.close()
        counters.close()
    os._exit(0)


def _reader(
    tag: str, folder: str, index: int, mode: str, group: int, size: int, versions: int, token: str, dtype: str
) -> None:
    """A reader (a policy worker's parameter path): records when each version arrived."""
    ctx = zmq.Context()
    stop = ShmArray.attach(f"{tag}_stop", (1,), "int32")
    when = ShmArray.attach(f"{tag}_when", (MAX_CELLS,), "float64")
    try:
        if mode == "flat":
            source: Any = RemoteSnapshot(ctx, f"ipc://{folder}/root", size, token, dtype)
        else:
            source = VersionedBuffer.attach_shared(f"{tag}_g{group}", size, np.float32)
        scratch = np.empty(size, np.float32)
        current = -1
        while not stop.array[0]:
            if source.version() > current:
                got = source.read_into(scratch, current)
                if got is not None:
                    current = got
                    when.array[index * versions + got] = time.monotonic()
                    continue
            if mode == "flat":
                source.socket.poll(20)
            else:
                time.sleep(0.002)
    finally:
        stop.close()
        when.close()
    os._exit(0)


def measure(
    mode: str,
    readers: int,
    per_group: int = 4,
    fan_out: int = 4,
    size: int = 1_000_000,
    versions: int = 10,
    interval: float = 0.5,
    dtype: str = "float32",
) -> dict[str, Any]:
    """One topology: ``readers`` readers, flat or in groups of ``per_group`` behind relays."""
    if readers * versions > MAX_CELLS:
        raise ValueError("readers x versions must be at most 65536")
    groups = math.ceil(readers / per_group) if mode == "hierarchical" else 0
    tag, folder = f"srl_{new_tag()}", tempfile.mkdtemp(prefix="srl-bench-")
    token = os.urandom(TOKEN_BYTES).hex()
    owned: list[Any] = []
    procs: list[mp.process.BaseProcess] = []
    ctx = mp.get_context("fork")
    try:
        root = VersionedBuffer.create_shared(f"{tag}_root", size, np.float32)
        owned.append(root)
        owned += [VersionedBuffer.create_shared(f"{tag}_g{g}", size, np.float32) for g in range(groups)]
        stop = ShmArray.create(f"{tag}_stop", (1,), "int32")
        counters = ShmArray.create(f"{tag}_cnt", (groups + 1, 2), "int64")
        when = ShmArray.create(f"{tag}_when", (MAX_CELLS,), "float64")
        owned += [stop, counters, when]
        when.array[:] = np.nan
        services = [("root", 0)] + [(f"relay{g}", g) for g in range(groups)]
        for slot, (name, group) in enumerate(services):
            procs.append(
                ctx.Process(target=_service, args=(tag, folder, name, group, groups, fan_out, size, token, dtype, slot))
            )
        for i in range(readers):
            procs.append(
                ctx.Process(
                    target=_reader, args=(tag, folder, i, mode, i % max(groups, 1), size, versions, token, dtype)
                )
            )
        for p in procs:
            p.start()
        snapshot = np.random.default_rng(0).standard_normal(size).astype(np.float32)
        published = np.zeros(versions)
        time.sleep(1.0)  # let every process connect before the first version
        for v in range(versions):
            snapshot[0] = v
            published[v] = time.monotonic()
            root.write(v, snapshot)
            time.sleep(interval)
        table = when.array[: readers * versions].reshape(readers, versions)
        deadline = time.monotonic() + 10.0
        while np.isnan(table[:, -1]).any() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.array[0] = 1
        for p in procs:
            p.join(10.0)
        sends, sent_bytes = (int(x) for x in counters.array[0])
        delivered = ~np.isnan(table)
        latency = np.nanmax(np.where(delivered, table, np.nan), axis=0) - published
        return {
            "bench": "params",
            "mode": mode,
            "readers": readers,
            "groups": groups,
            "fan_out": fan_out,
            "snapshot_bytes": size * transfer.itemsize(dtype),
            "versions": versions,
            "root_sends_per_version": sends / versions,
            "root_bytes_per_version": sent_bytes / versions,
            "relay_sends_per_version": float(counters.array[1:, 0].sum()) / versions,
            "delivered_fraction": float(delivered.mean()),
            "last_reader_latency_ms_median": round(float(np.nanmedian(latency)) * 1000, 2),
        }
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for obj in owned:
            obj.close()
            obj.unlink()
        shutil.rmtree(folder, ignore_errors=True)


def bench_params(readers: list[int], **kwargs: Any) -> list[dict[str, Any]]:
    """Flat and hierarchical, for each reader count."""
    return [measure(mode, n, **kwargs) for mode in ("flat", "hierarchical") for n in readers]
