"""Run a process-runner pipeline, fork, and run it again in the forked child.

The child inherits the handle of the parent's forkserver, a process that is not its child.
Exit status 0 when the child's output equals the parent's; the child's error is printed.
Usage: ``python -m tests.runners._fork_after_pool``.
"""

from __future__ import annotations

import os
from typing import Any

from zephon import Dataset, Pipeline, StaticMixtureWorkSource


def double(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "x": payload["x"] * 2}


def run() -> list[int]:
    rows = [{"x": i} for i in range(50)]
    source = StaticMixtureWorkSource([Dataset.from_records("rows", rows)], chunk_size=10)
    pipe = Pipeline(source).map_transform(double, parallelism=2).options(runner="process")
    return [r.payload["x"] for r in pipe]


def child(expected: list[int]) -> int:
    try:
        got = run()
    except BaseException as exc:
        print(f"child: {type(exc).__name__}: {exc}", flush=True)
        return 2
    return 0 if got == expected else 1


if __name__ == "__main__":
    first = run()
    assert first == [2 * i for i in range(50)]
    pid = os.fork()
    if pid == 0:
        os._exit(child(first))
    _, status = os.waitpid(pid, 0)
    raise SystemExit(os.waitstatus_to_exitcode(status))
