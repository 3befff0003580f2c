"""A trainer reading a StreamingCaptureSource pipeline, for the SIGKILL test.

``python -m tests.capture._stream_consumer URL WORKDIR KILL`` reads the admitted groups of
stream ``s``; for each it marks the scored members ``trained`` at the group's
``trained_version`` and then replaces ``WORKDIR/model.json`` (the positions delivered so far
and the pipeline checkpoint after them) durably. It sends itself a SIGKILL just before its
``KILL``-th operation (0: never) and prints ``op`` as each one starts (a parent may kill it
after any of them); ``done`` after the last group.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from zephon import Pipeline
from zephon.capture.dataset import run_sync
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource

STREAM = "s"
_OPS = [0, 0]  # [done, kill at]


def _tick() -> None:
    _OPS[0] += 1
    if _OPS[0] == _OPS[1]:
        os.kill(os.getpid(), signal.SIGKILL)
    print("op", flush=True)


def _save(path: Path, model: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(model, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run(url: str, workdir: Path, prompts: int) -> None:
    path = workdir / "model.json"
    model = json.loads(path.read_text()) if path.exists() else {"delivered": [], "ckpt": None}
    store = open_store(url)
    source = StreamingCaptureSource(
        store, STREAM, groups_per_step=2, max_staleness=100, prompts=prompts
    )
    pipe = Pipeline(source)
    if model["ckpt"] is not None:
        pipe.restore(model["ckpt"])
    for record in pipe:
        group = record.payload
        refs = [(group["position"], m["index"], m["attempt"]) for m in group["members"]]
        _tick()
        run_sync(store.advance(STREAM, refs, "trained", step=group["trained_version"]))
        model["delivered"].append(group["position"])
        model["ckpt"] = pipe.checkpoint()
        _tick()
        _save(path, model)
    run_sync(store.close())
    print("done", flush=True)


if __name__ == "__main__":
    _OPS[1] = int(sys.argv[3])
    run(sys.argv[1], Path(sys.argv[2]), int(sys.argv[4]))
