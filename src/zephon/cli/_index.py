"""``zephon index PATH``: write ``PATH/index.json`` (row counts per shard) for instant discovery."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from zephon.cli._common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, fail
from zephon.errors import ConfigError, ZephonError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "index",
        description=(
            "Scan every shard of a dataset folder (local path or fsspec URL) once, cache the JSONL "
            "byte-offset indexes, and write PATH/index.json so Dataset.from_path(PATH) needs no "
            "scan. Re-run it after adding, removing or rewriting shards."
        ),
    )
    _add_arguments(parser)
    parser.set_defaults(func=_run)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="dataset folder (local or fsspec URL)")
    parser.add_argument(
        "--format", dest="fmt", default=None, metavar="FORMAT",
        help="treat every file as this registered file format, e.g. jsonl or parquet "
        "(default: detect from the suffix; zephon.io.format_names() lists them)",
    )  # fmt: skip
    parser.add_argument(
        "--cache-dir", default=None, help="where offset indexes of read-only data go"
    )


def _run(args: argparse.Namespace) -> int:
    from zephon.io import build_index

    start = time.perf_counter()
    try:
        index = build_index(args.path, fmt=args.fmt, cache_dir=args.cache_dir)
    except ConfigError as e:  # a missing extra, a bad format
        return fail("index", e, EXIT_USAGE)
    except ZephonError as e:  # data that cannot be read
        return fail("index", e, EXIT_FAILURE)
    elapsed = time.perf_counter() - start
    print(
        f"wrote {args.path.rstrip('/')}/index.json: {len(index['shards'])} shards, "
        f"{index['total_rows']} rows ({elapsed:.2f} s)"
    )
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Run ``zephon index`` on its own (``python -m zephon.cli._index PATH``)."""
    parser = argparse.ArgumentParser(prog="zephon index")
    _add_arguments(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
