"""``zephon trace``: which documents made a training step, and which steps trained on one.

``zephon trace PIPELINE.yaml --step N [--rank R] [--checkpoint-dir D]`` rebuilds the batch of
step N (from the newest checkpoint at or before it) and prints its segments with a preview;
``zephon trace LOG... --find FILE:LINE`` (or ``FILE#ROW``, or a sample id ``D:S:I``) names
the steps and ranks of a ``zephon run --provenance`` log that trained on a document.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from zephon.cli._common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, fail
from zephon.cli._report import console
from zephon.errors import ConfigError, ZephonError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "trace",
        description="With --step: rebuild the batch a rank received at step N (0-based; from "
        "the newest checkpoint of --checkpoint-dir at or before N, else from the start) and "
        "print its segments. With --find: look a document up in provenance logs written by "
        "`zephon run --provenance`. Exit codes: 0 found, 1 not found or failed, 2 bad usage.",
    )
    parser.add_argument(
        "target", nargs="+", metavar="PIPELINE.yaml|LOG",
        help="the pipeline (with --step) or provenance logs (with --find)",
    )  # fmt: skip
    parser.add_argument("--step", type=int, default=None, metavar="N", help="step to trace")
    parser.add_argument("--rank", type=int, default=None, metavar="R", help="data-parallel rank")
    parser.add_argument(
        "--checkpoint-dir", type=Path, default=None, metavar="DIR",
        help="restore the newest checkpoint at or before N from DIR (zephon run's)",
    )  # fmt: skip
    parser.add_argument(
        "--find", default=None, metavar="FILE:LINE",
        help="the steps that trained on FILE:LINE, FILE#ROW (FILE:ROW in a file without "
        "lines) or sample id DATASET:SHARD:ROW (DATASET a name or a number)",
    )  # fmt: skip
    parser.add_argument("--runner", default=None, help="override the pipeline's runner")
    parser.add_argument("--json", action="store_true", help="print JSON for tools")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.step is None) == (args.find is None):
        return fail("trace", "give exactly one of --step N and --find FILE:LINE", EXIT_USAGE)
    if args.find is not None:
        return _find(args)
    if len(args.target) != 1:
        return fail("trace", "--step traces one pipeline; give one PIPELINE.yaml", EXIT_USAGE)
    from zephon.provenance import trace

    try:
        result = trace(
            args.target[0],
            args.step,
            rank=args.rank,
            checkpoint_dir=args.checkpoint_dir,
            runner=args.runner,
            progress=not (args.quiet or args.json),
        )
    except ConfigError as exc:
        return fail("trace", str(exc).removeprefix("trace: "), EXIT_USAGE)
    except ZephonError as exc:
        return fail("trace", exc, EXIT_FAILURE)
    except OSError as exc:
        return fail("trace", exc, EXIT_USAGE)
    if args.json:
        print(json.dumps(result.to_dict()))
        return EXIT_OK
    _print_trace(result)
    return EXIT_OK


def _print_trace(result: Any) -> None:
    from rich.table import Table

    out = console()
    where = result.restored_from or "the start"
    out.print(
        f"step {result.step}, rank {result.rank}, lane {result.provenance.lane}: "
        f"fingerprint {result.fingerprint} (replayed {result.replayed} item(s) from {where} "
        f"in {result.elapsed_s:.2f} s)"
    )
    table = Table("row", "seg", "dataset", "where", "sample id", "lineage", "row span",
                  "source span", "preview")  # fmt: skip
    for (r, s, seg), preview in zip(
        result.provenance.segments(), [p for row in result.previews for p in row], strict=True
    ):
        table.add_row(
            str(r), str(s), seg.dataset, seg.where, ":".join(map(str, seg.sample_id)),
            ".".join(map(str, seg.lineage)), f"{seg.start}-{seg.end}",
            seg.span, preview,
        )  # fmt: skip
        for image in seg.images:  # a packed image row: where each image of the sample is
            table.add_row("", "", "", seg.image_where(image), "", "", f"{image.start}-{image.end}",
                          "", f"image {image.index}")  # fmt: skip
    out.print(table)


def _find(args: argparse.Namespace) -> int:
    from zephon.provenance import FIND_FORMS, find

    if args.step is not None or args.checkpoint_dir is not None:
        return fail("trace", "--find reads provenance logs; drop --step/--checkpoint-dir")
    try:
        hits = find(args.target, args.find)
    except (ValueError, OSError) as exc:
        return fail("trace", exc, EXIT_USAGE)
    if args.json:
        print(json.dumps({"query": args.find, "hits": [h.__dict__ for h in hits]}))
    elif not hits:
        print(f"{args.find}: not in the logged steps ({_logged_datasets(args.target)}give "
              f"{FIND_FORMS})")  # fmt: skip
    else:
        for h in hits:
            where = f"{h.source}:{h.line}" if h.line is not None else f"{h.source}#{h.source_row}"
            print(
                f"step {h.step} rank {h.rank} row {h.row} segment {h.segment}: {where} "
                f"tokens {h.source_start}-{h.source_end} at {h.start}-{h.end}"
            )
    return EXIT_OK if hits else EXIT_FAILURE


def _logged_datasets(logs: list[str]) -> str:
    """The dataset names a miss may have meant, as the start of its advice."""
    from zephon.provenance import read_log, run_dataset_names

    names = sorted(n for n in run_dataset_names(read_log(logs)) if n)
    return f"the logs hold datasets {', '.join(names)}; " if names else ""
