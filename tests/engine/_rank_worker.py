"""A data-parallel rank in its own process: consume, checkpoint, gather (used by tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.engine._stateful import REFERENCE_CFG, build, key
from zephon.distributed import gather_checkpoints


def main() -> None:
    rank, world, steps, mode, where = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
        sys.argv[5],
    )
    pipe = build(REFERENCE_CFG, runner="inline", dp_rank=rank, dp_world_size=world)
    it = iter(pipe)
    seen = [key(next(it)) for _ in range(steps)]
    state = pipe.checkpoint()
    it.close()  # type: ignore[attr-defined]
    if mode == "folder":
        merged = gather_checkpoints(state, folder=where, tag="step-3", timeout_s=60)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{where}", rank=rank, world_size=world)
        merged = gather_checkpoints(state)
        dist.destroy_process_group()
    out = Path(where).parent / f"out-{mode}-{rank}.json"
    out.write_text(json.dumps({"merged": merged, "seen": [[k[0], repr(k[1])] for k in seen]}))


if __name__ == "__main__":
    main()
