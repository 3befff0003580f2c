"""``zephon demo``: the `make demo` job."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    from zephon.demo import add_arguments

    parser = subparsers.add_parser("demo")
    add_arguments(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from zephon.demo import run

    return run(args)
