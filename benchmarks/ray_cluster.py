"""Throughput on a simulated multi-node Ray cluster (head + io node + two cpu nodes, loopback).

Runs the multi-node test's scenario (tests/runners/_ray_cluster.py) in its own driver process
with more documents: inline for reference, a first iteration (actors start), a second one
(the same actors), and one during which a cpu node is removed. Every run's output is checked
against inline. Prints a table and one final JSON line.
Usage: ``python benchmarks/ray_cluster.py [--docs N] [--tokenizer PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    "inline (driver only)": "inline",
    "cluster, first iteration (actors start)": "first",
    "cluster, second iteration (actors reused)": "second",
    "cluster, a cpu node removed mid-run": "after_removal",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--tokenizer", default="bytes")
    args = parser.parse_args()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.runners._ray_cluster", args.tokenizer, str(args.docs)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(proc.stdout.splitlines()[-1])
    digest = out["inline"][0]
    rows = {}
    print("| run | records | seconds | records/s |\n| --- | ---: | ---: | ---: |")
    for label, name in RUNS.items():
        got, records, seconds = out[name]
        assert got == digest, f"{label}: output differs from inline"
        rows[name] = {
            "records": records,
            "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds),
        }
        print(f"| {label} | {records} | {seconds:.2f} | {records / seconds:.0f} |")
    print(json.dumps({"benchmark": "ray_cluster", "docs": args.docs, "runs": rows}))


if __name__ == "__main__":
    main()
