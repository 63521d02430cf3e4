"""The stage's role: ``stage.per_node`` workers on each actor node group, standing on the sample path between the
actors and the trainers (``workers.path``: ``stage``), each deciding on its actors' segments with the class
``stage.worker`` names."""

from __future__ import annotations

from srl.api.plugins import resolve
from srl.api.stage import StageClass, StageContext
from srl.api.worker import Worker
from srl.runtime.build import BuildContext
from srl.runtime.topology import Endpoint, Hop, Layout, Report, Role, StreamKind, snapshot_endpoint
from srl.stage.worker import StageWorker
from srl.system.streams import SAMPLE_WIDTH

SUBMITTED = StreamKind("stage", "stage{}", channel=SAMPLE_WIDTH, segments=True)
"""Stage worker ``s``'s stream of submitted segments (actors -> stage, in its node's pool)."""


def build(ctx: BuildContext) -> Worker:
    """Stage worker ``s``: the class ``stage.worker`` names decides on each segment its actors submit."""
    plan, fabric, index = ctx.plan, ctx.fabric, ctx.worker.index
    cfg = plan.cfg
    assert cfg.stage.worker is not None
    make: StageClass = resolve(cfg.stage.worker, {}, "stage.worker")
    snapshots = ctx.snapshots()
    layout = plan.only("a stage").layout
    stage = make(StageContext(index, layout.fields, dict(cfg.stage.args), cfg, snapshots.version))
    return StageWorker(
        index,
        stage,
        fabric.segment_source(ctx.worker),
        fabric.segment_forwarder(ctx.worker),
        ctx.reporter,
        wait_timeout=ctx.wait_timeout,
        report_interval=max(ctx.report_interval, 0.5),
    )


def _connects(plan: Layout, stage: int) -> tuple[Endpoint, ...]:
    """Snapshots (read for their version only), as a policy worker of its node group reads them."""
    return (snapshot_endpoint(plan, plan.stage_node(stage), stage),)


STAGE = Role(
    "stage",
    count=lambda plan: plan.stages_per_node * plan.nodes,
    builder="srl.stage.role:build",
    seed_salt=6,
    group=lambda plan, s: plan.stage_node(s),
    connects=_connects,
    cpus=lambda plan: plan.cfg.ray.cpus_per_stage,
    hop=Hop(SUBMITTED, route=lambda plan, actor, policy: plan.stage_of(actor)),
    report=Report("stage", "srl.stage.worker:StageReports"),
)
