"""Entry point of an exec'd worker process: ``python -m srl.runtime.worker_main`` with a JSON spec on stdin.

Used by the local runtime's ``exec`` start method (the default off Linux): the
worker rebuilds its plan from the resolved config and opens the controller's
shared memory and pipes by name. The spec is plain JSON, never a pickle.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from srl.runtime.fabric import SharedFabric
from srl.runtime.local import _worker_main
from srl.runtime.plan import plan_from_spec


def main() -> None:
    spec = json.loads(sys.stdin.read())
    plan = plan_from_spec(spec)
    fabric = SharedFabric(plan, tag=str(spec["tag"]), directory=Path(spec["dir"]))
    run_dir = None if spec["run_dir"] is None else Path(spec["run_dir"])
    _worker_main(
        plan,
        fabric,
        plan.topology.get(str(spec["role"]), int(spec["index"])),
        run_dir,
        int(spec["parent"]),
        int(spec["incarnation"]),
        int(spec["min_version"]),
        int(spec["env_steps"]),
    )


if __name__ == "__main__":
    main()
