"""Run a process-runner pipeline that keeps its workers, fork twice, and run it again in both
forked children at once, then in the parent.

The children inherit the handle of the parent's forkserver (a process that is not their
child) and the parent's idle workers, whose pipes they must not use. Exit status 0 when every
run's output equals the first; a child's error is printed.
Usage: ``python -m tests.runners._fork_after_pool``.
"""

from __future__ import annotations

import os
from typing import Any

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

ROWS = 2000


def double(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "x": payload["x"] * 2}


def run() -> list[int]:
    rows = [{"x": i} for i in range(ROWS)]
    source = StaticMixtureWorkSource([Dataset.from_records("rows", rows)], chunk_size=10)
    pipe = (
        Pipeline(source)
        .map_transform(double, parallelism=2)
        .options(runner="process", reuse_workers=True)
    )
    return [r.payload["x"] for r in pipe]


def child(expected: list[int]) -> int:
    try:
        got = run()
    except BaseException as exc:
        print(f"child {os.getpid()}: {type(exc).__name__}: {exc}", flush=True)
        return 2
    return 0 if got == expected else 1


if __name__ == "__main__":
    first = run()  # leaves two idle workers
    assert first == [2 * i for i in range(ROWS)]
    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            os._exit(child(first))
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    again = run()  # the parent's idle workers still serve it
    print("children", codes, "parent again", again == first, flush=True)
    raise SystemExit(0 if codes == [0, 0] and again == first else 1)
