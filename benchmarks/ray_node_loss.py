"""Node-loss campaign on a simulated 3-node Ray cluster (head + two cpu nodes, loopback).

Runs tests/runners/_ray_node_loss.py in its own driver process: each run iterates the
pipeline while a busy cpu node (one with micro-batches in flight) is removed ``--removals``
times and replaced; every batch of every run is compared with inline. Prints a table (one row
per run) and one final JSON line with how many runs were identical to inline.
Usage: ``python benchmarks/ray_node_loss.py [--runs 10] [--removals 6] [--docs 3000]
[--retries 3] [--tokenizer PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--removals", type=int, default=6)
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--retries", type=int, default=3, help="max_worker_retries")
    parser.add_argument("--tokenizer", default="bytes")
    args = parser.parse_args()
    argv = [args.tokenizer, args.runs, args.removals, args.docs, args.retries]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.runners._ray_node_loss", *map(str, argv)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(proc.stderr[-4000:])
    out = json.loads(proc.stdout.splitlines()[-1])
    print("| run | identical | batches | removals (in flight on victim) | seconds | error |")
    print("| ---: | --- | ---: | --- | ---: | --- |")
    for i, run in enumerate(out["runs"]):
        pending = ", ".join(str(r["pending"]) for r in run["removals"])
        error = (run["error"] or "").splitlines()[0][:80] if run["error"] else ""
        print(
            f"| {i + 1} | {run['identical']} | {run['batches']}/{out['batches']} "
            f"| {len(run['removals'])} ({pending}) | {run['seconds']:.1f} | {error} |"
        )
    identical = sum(
        run["identical"] and len(run["removals"]) == args.removals for run in out["runs"]
    )
    print(
        json.dumps(
            {
                "benchmark": "ray_node_loss",
                "runs": args.runs,
                "removals_per_run": args.removals,
                "docs": args.docs,
                "max_worker_retries": args.retries,
                "identical_to_inline": identical,
                "seconds": [run["seconds"] for run in out["runs"]],
            }
        )
    )


if __name__ == "__main__":
    main()
