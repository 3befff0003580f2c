"""``zephon convert PIPELINE.yaml OUT/``: tokenize once into Megatron shards, resumably.

SIGTERM and Ctrl-C stop it with the finished shards recorded (exit 143 / 130); running the
same command again continues and writes the same bytes an uninterrupted run would have.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from zephon.cli._common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    fail,
)
from zephon.errors import ConfigError, ZephonError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert",
        description="Run the pipeline's operators up to its tokenize/tokenize_chat over every "
        "dataset on every core and write OUT/: Megatron .bin/.idx shards, a manifest "
        "(zephon-convert.json) and per-shard provenance and loss-mask sidecars. Run it again "
        "after a crash or SIGTERM to finish. Exit codes: 0 done, 1 failed, 2 bad usage, "
        "130/143 stopped (run again to resume).",
    )
    parser.add_argument("pipeline", type=Path, metavar="PIPELINE.yaml", help="the pipeline")
    parser.add_argument(
        "out", metavar="OUT", help="the output folder, or an fsspec URL (s3://bucket/corpus)"
    )
    parser.add_argument("--workers", type=int, default=None, help="processes (default: cores)")
    parser.add_argument(
        "--documents-per-shard", type=int, default=None, metavar="N",
        help="input documents per output shard (default 50000)",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "uint16", "int32", "int64"),
        help="token dtype (auto: uint16 when every id the tokenizer can emit fits, "
        "special tokens included, else int32)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--quiet", action="store_true", help="no per-shard lines")
    parser.set_defaults(func=run)


class _Stop:
    """The first SIGTERM/SIGINT asks the conversion to stop between shards' records."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self) -> bool:
        return self.signum is not None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum


def run(args: argparse.Namespace) -> int:
    from zephon.convert import ConvertStopped, convert
    from zephon.convert._plan import DEFAULT_DOCUMENTS_PER_SHARD

    stop = _Stop()
    previous = {s: signal.signal(s, stop.handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def progress(entry: dict[str, Any], done: int, total: int) -> None:
        if not (args.quiet or args.json):
            print(f"[{done}/{total}] {entry['name']}: {entry['documents']} documents, "
                  f"{entry['tokens']} tokens", file=sys.stderr)  # fmt: skip

    try:
        result = convert(
            args.pipeline,
            args.out,
            workers=args.workers,
            documents_per_shard=args.documents_per_shard or DEFAULT_DOCUMENTS_PER_SHARD,
            dtype=args.dtype,
            stop=stop,
            on_shard=progress,
        )
    except ConvertStopped:
        code = EXIT_TERMINATED if stop.signum == signal.SIGTERM else EXIT_INTERRUPTED
        print(f"zephon convert: stopped; run the same command again to resume {args.out}",
              file=sys.stderr)  # fmt: skip
        return code
    except ConfigError as exc:
        return fail("convert", exc, EXIT_USAGE)
    except (ZephonError, OSError) as exc:
        return fail("convert", exc, EXIT_FAILURE)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        rate = result.tokens / result.elapsed_s if result.elapsed_s > 0 else 0.0
        print(
            f"{result.out}: {result.shards} shards ({result.converted} converted, "
            f"{result.skipped} already done), {result.documents} documents, {result.tokens} "
            f"{result.dtype} tokens in {result.elapsed_s:.1f} s ({rate:,.0f} tokens/s)"
        )
    return EXIT_OK
