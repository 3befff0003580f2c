"""Engine overhead per record: what the engine's own Python work costs, per runner.

100,000 one-word records (``Dataset.from_records``, chunk 4096, ``batch(64)``) with no map and
with 4 identity ``map_transform`` s: docs/s and CPU-us per doc (every thread of this process,
plus for ``process`` and ``engine_process`` rows the processes below it, from /proc), and
docs/s relative to inline in the same round. Rounds interleave every configuration, so ratios
compare runs made under the same machine load; the table gives medians.

``--peer PYTHON`` also runs the same pipelines with the ``zephon`` that interpreter imports
(the 0.2.0 release from PyPI in a separate venv: ``python -m venv peer && peer/bin/pip install
zephon==0.2.0``), so the two can be compared in one run.

Prints a table and a final JSON line. Usage: ``python benchmarks/overhead.py [--peer PY]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource


def _identity(payload: Any) -> Any:
    return payload


def overhead_pipe(maps: int, n: int, **options: Any) -> Pipeline:
    rows = [{"text": "word"} for _ in range(n)]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("rows", rows)],
        mixture=MixtureSpec({"rows": 1.0}),
        chunk_size=4096,
        seed=0,
    )
    pipe = Pipeline(source)
    for _ in range(maps):
        pipe = pipe.map_transform(_identity)
    return pipe.batch(64).options(**options)


def descendants_cpu_s() -> dict[int, float]:
    """CPU seconds of every live process below this one, by pid, from /proc: engine
    processes and process workers are forked by a forkserver, so they are grandchildren."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    todo = [os.getpid()]
    while todo:
        for child in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                pids = [int(pid) for pid in child.read_text().split()]
            except FileNotFoundError:
                continue
            for pid in pids:
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except FileNotFoundError:
                    continue
                found[pid] = sum(int(stat[i]) for i in (11, 12, 13, 14)) / tick
                todo.append(pid)
    return found


def cpu_since(before: dict[int, float]) -> float:
    """CPU seconds the processes below this one used since ``before`` was read."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in descendants_cpu_s().items())


def overhead_run(maps: int, n: int, options: dict[str, Any]) -> tuple[float, float]:
    """docs/s and CPU-us per doc of one run of the overhead pipeline (its processes too)."""
    pipe = overhead_pipe(maps, n, **options)
    others = options.get("engine_process") or options.get("runner") == "process"
    before = descendants_cpu_s() if others else {}
    cpu, wall = time.process_time(), time.perf_counter()
    count = 0
    child_cpu = 0.0
    for batch in pipe:
        count += len(batch)
        if count >= n - n % 64 and others:
            child_cpu = cpu_since(before)  # before the processes exit and are reaped
    assert count == n - n % 64, count
    cpu, wall = time.process_time() - cpu + child_cpu, time.perf_counter() - wall
    return count / wall, cpu / count * 1e6


CONFIGS: dict[str, dict[str, Any]] = {
    "inline": {"runner": "inline"},
    "threads": {"runner": "threads"},
    "threads fuse=False": {"runner": "threads", "fuse": False},
    "process": {"runner": "process"},
    "threads, engine_process": {"runner": "threads", "engine_process": True},
}

PEER_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from zephon import Dataset, InMemoryShard, MixtureSpec, Pipeline, StaticMixtureWorkSource

    def ident(x):
        return x

    if __name__ == "__main__":
        maps, n, runner = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
        rows = [{"text": "word"} for _ in range(n)]
        ds = Dataset.from_dict("rows", {0: InMemoryShard(rows)})
        pipe = Pipeline(StaticMixtureWorkSource([ds], MixtureSpec({"rows": 1.0}), 4096))
        for _ in range(maps):
            pipe = pipe.map_transform(ident)
        pipe = pipe.batch(64).options(runner=runner)
        cpu, wall = time.process_time(), time.perf_counter()
        count = sum(len(b) for b in pipe)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(json.dumps([count / wall, cpu / count * 1e6]))
    """
)


def peer_run(python: str, script: Path, maps: int, n: int, runner: str) -> tuple[float, float]:
    done = subprocess.run(
        [python, str(script), str(maps), str(n), runner],
        capture_output=True,
        text=True,
        check=True,
        cwd=script.parent,  # not this checkout: the interpreter's own zephon
    )
    rate, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    return float(rate), float(cpu)


def rows_for(
    maps: int,
    n: int,
    rounds: int,
    peer: tuple[str, Path] | None = None,
    configs: dict[str, dict[str, Any]] = CONFIGS,
) -> list[Any]:
    """One row per configuration (and per PyPI runner with ``peer``); ``inline`` first."""
    runs: dict[str, list[tuple[float, float]]] = {c: [] for c in configs}
    peer_runs: dict[str, list[tuple[float, float]]] = {"inline": [], "threads": []}
    for _ in range(rounds):
        for name, options in configs.items():
            runs[name].append(overhead_run(maps, n, options))
        if peer is not None:
            for runner, got in peer_runs.items():
                got.append(peer_run(peer[0], peer[1], maps, n, runner))
    bench = f"{maps} x map" if maps else "no map"
    rows = [_row(bench, f"zephon {name}", got, runs["inline"]) for name, got in runs.items()]
    if peer is not None:
        inline = peer_runs["inline"]
        rows += [_row(bench, f"PyPI 0.2.0 {r}", got, inline) for r, got in peer_runs.items()]
    return rows


def _row(bench: str, name: str, got: list[tuple[float, float]], inline: list[Any]) -> Any:
    ratio = [g[0] / i[0] for g, i in zip(got, inline, strict=True)]
    return {
        "bench": bench,
        "runner": name,
        "docs_per_s": round(statistics.median(g[0] for g in got)),
        "cpu_us_per_doc": round(statistics.median(g[1] for g in got), 2),
        "vs_inline": round(statistics.median(ratio), 3),
    }


def print_table(rows: list[dict[str, Any]], cols: list[str], name: str, **extra: Any) -> None:
    width = max(len(str(r.get(c, ""))) for r in rows for c in cols) + 1
    print(" | ".join(f"{c:>{width}}" for c in cols))
    for row in rows:
        print(" | ".join(f"{row.get(c, ''):>{width}}" for c in cols))
    print(json.dumps({"benchmark": name, "cores": os.cpu_count(), **extra, "rows": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peer", help="a Python whose `import zephon` is the PyPI release")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        peer = None
        if args.peer:
            script = Path(tmp) / "peer_overhead.py"
            script.write_text(PEER_SCRIPT)
            peer = (args.peer, script)
        rows = [r for maps in (0, 4) for r in rows_for(maps, args.records, args.rounds, peer)]
    print(f"cores: {os.cpu_count()}  records: {args.records}  python: {sys.version.split()[0]}")
    print_table(rows, ["bench", "runner", "docs_per_s", "cpu_us_per_doc", "vs_inline"], "overhead")


if __name__ == "__main__":
    main()
