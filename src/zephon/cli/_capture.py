"""``zephon capture conformance STORE_URL``: run the conformance suite against a store URL."""

from __future__ import annotations

import argparse
import asyncio
import sys
import warnings
from typing import Any

from zephon.cli._common import EXIT_USAGE, fail
from zephon.errors import MissingDependencyError


def register(subparsers: Any) -> None:
    capture = subparsers.add_parser("capture")
    sub = capture.add_subparsers(dest="capture_command", metavar="COMMAND")
    conf = sub.add_parser(
        "conformance",
        help="check a capture store against every contract clause",
        description="Run zephon.capture.conformance against fresh clients of STORE_URL "
        "(memory://NAME, file:///DIR, sqlite:///FILE, postgresql://...). Exit code 1 on failure.",
    )
    conf.add_argument("store_url", metavar="STORE_URL", help="the store to check (see above)")
    conf.add_argument("--prefix", default=None, help="rollout id prefix (default: unique per run)")
    conf.add_argument(
        "--check", action="append", default=None, metavar="NAME", help="run only this check"
    )
    conf.add_argument("--timeout", type=float, default=60.0, help="seconds per check (60)")
    conf.add_argument("--list", action="store_true", help="list the checks and exit")
    conf.set_defaults(func=_conformance)
    from zephon.cli._capture_serve import register_serve  # `capture serve` (the proxy)

    register_serve(sub)
    from zephon.cli._capture_tools import register_tools  # `capture inspect` / `export`

    register_tools(sub)
    capture.set_defaults(func=lambda _args: capture.print_help() or 2)


def _conformance(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from zephon._console import PipeConsole
    from zephon.capture.conformance import CHECKS, ConformanceWarning, run_conformance
    from zephon.capture.stores import open_store, store_class

    console = PipeConsole()
    if args.list:
        for name in CHECKS:
            console.print(name)
        return 0
    try:
        store_class(args.store_url)
    except (ValueError, ImportError) as exc:
        return fail("capture conformance", exc, EXIT_USAGE)

    def factory() -> Any:
        return open_store(args.store_url)

    try:
        asyncio.run(_probe(factory))
    except MissingDependencyError as exc:  # every check would fail with the same message
        return fail("capture conformance", exc, EXIT_USAGE)
    except Exception:
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConformanceWarning)
        try:
            report = asyncio.run(
                run_conformance(
                    factory,
                    factory,
                    factory,
                    factory,
                    rollout_prefix=args.prefix,
                    checks=args.check,
                    raise_on_failure=False,
                    timeout_s=args.timeout,
                )
            )
        except ValueError as exc:
            return fail("capture conformance", exc, EXIT_USAGE)
    table = Table(title=f"capture conformance: {args.store_url}")
    table.add_column("check")
    table.add_column("result")
    table.add_column("ms", justify="right")
    table.add_column("detail")
    style = {"passed": "green", "failed": "red", "warned": "yellow"}
    for r in report.results:
        table.add_row(
            r.name, f"[{style[r.status]}]{r.status}[/]", f"{r.seconds * 1000:.1f}", escape(r.detail)
        )
    console.print(table)
    n_fail, n_warn = len(report.failed), len(report.warnings)
    console.print(f"checks: {len(report.passed)} ok / {n_fail} failing / {n_warn} with warnings")
    return 1 if n_fail else 0


async def _probe(factory: Any) -> None:
    """Open and close one client (a missing driver then fails once, with one line)."""
    store = factory()
    await store.close()


def main(argv: list[str] | None = None) -> int:
    """Standalone entry: ``python -m zephon.cli._capture conformance URL``."""
    parser = argparse.ArgumentParser(prog="zephon")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    args = parser.parse_args(["capture", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
