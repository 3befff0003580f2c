"""``zephon diff A B``: the first step at which two runs delivered different data.

A and B are provenance logs (``zephon run --provenance``) or ``--record`` files. Exit codes
follow diff(1): 0 the same, 1 they differ, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from zephon.cli._common import EXIT_DIFFERENT, EXIT_OK, EXIT_USAGE, fail


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diff",
        description="Compare two provenance logs (zephon run --provenance) or two --record "
        "files step by step; print the first differing step and the segments found in one run "
        "only. Exit codes: 0 identical, 1 they differ, 2 bad usage.",
    )
    parser.add_argument("a", type=Path, metavar="A", help="provenance log or --record file")
    parser.add_argument("b", type=Path, metavar="B", help="the other run's, of the same kind")
    parser.add_argument("--json", action="store_true", help="print JSON for tools")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from zephon.provenance import diff

    for path in (args.a, args.b):
        if not path.exists():
            return fail("diff", f"{path} does not exist", EXIT_USAGE)
    try:
        found = diff(args.a, args.b)
    except (ValueError, OSError) as exc:
        return fail("diff", exc, EXIT_USAGE)
    if args.json:
        print(json.dumps({"same": found is None, "first": found.to_dict() if found else None}))
        return EXIT_OK if found is None else EXIT_DIFFERENT
    if found is None:
        print(f"no difference: {args.a} and {args.b} delivered the same data at every step")
        return EXIT_OK
    if found.stops is not None:
        other = "B" if found.stops == "A" else "A"
        print(
            f"{found.stops} stops at step {found.step} (rank {found.rank}), {other} goes on: "
            f"steps {found.steps_a} vs {found.steps_b}; every step before is the same"
        )
        return EXIT_DIFFERENT
    print(
        f"first difference at step {found.step} (rank {found.rank}): fingerprint "
        f"{found.fingerprint_a} vs {found.fingerprint_b}; steps {found.steps_a} vs {found.steps_b}"
    )
    for label, segs in (
        ("only in A", found.only_a), ("only in B", found.only_b), ("moved", found.moved)
    ):  # fmt: skip
        for seg in segs[:20]:
            print(f"  {label}: " + " ".join(f"{k}={v}" for k, v in seg.items()))
        if len(segs) > 20:
            print(f"  {label}: ... {len(segs) - 20} more")
    return EXIT_DIFFERENT
