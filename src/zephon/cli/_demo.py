"""``zephon demo``: the `make demo` job."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="generate a small corpus and run decode -> tokenize -> batch on it"
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="options of python -m zephon.demo")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from zephon.demo import main

    return main(list(args.args))
