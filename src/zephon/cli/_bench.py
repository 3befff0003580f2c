"""``zephon bench``: run the benchmark scripts (small sizes by default), collect their final
JSON lines into one report, and draw PNG plots when matplotlib is installed.

The scripts live in the source checkout's ``benchmarks/`` folder (each prints a table and, last,
one JSON line); they are not part of the installed package, so ``--benchmarks-dir`` points at
them when zephon is not installed from a checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zephon._atomic import write_atomic
from zephon._optional import EXTRA_OF, require
from zephon.cli._common import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, fail
from zephon.errors import MissingDependencyError

#: Benchmark script -> arguments for a small run ({tmp} is a scratch folder). Run order.
SMALL: dict[str, list[str]] = {
    "sources": ["--quick"],
    "checkpoint": ["--docs", "6000", "--lanes", "2"],
    "engine": ["--docs", "300", "--records", "5000", "--repeats", "1", "--data", "{tmp}/engine"],
    "pipeline": ["--docs", "600", "--repeats", "1", "--data", "{tmp}/pipeline"],
    "lineage": ["--stores", "memory,file", "--rollouts", "20", "--calls", "20"],
    "capture_stores": [
        "--puts", "40", "--stores", "memory,file", "--freeze-rollouts", "4", "--dir", "{tmp}/s",
    ],
}  # fmt: skip
#: Run only when asked for with --only (installs the released zephon from PyPI in its own venv).
OPTIONAL = ("compare_zephon",)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        description="Run benchmarks/*.py in fresh processes, collect each one's final JSON "
        "line into --out, and draw one PNG per benchmark into --plots when matplotlib is "
        "installed (pip install 'zephon[plots]'). Exit code 1 when a benchmark fails.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only", action="append", default=None, metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join([*SMALL, *OPTIONAL])}",
    )  # fmt: skip
    parser.add_argument(
        "--full", action="store_true", help="use each script's default (large) sizes"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench-report.json"), metavar="FILE",
        help="where to write the JSON report (bench-report.json)",
    )  # fmt: skip
    parser.add_argument(
        "--plots", type=Path, default=None, metavar="DIR", help="PNG folder (bench-plots/)"
    )
    parser.add_argument(
        "--benchmarks-dir", type=Path, default=None, metavar="DIR",
        help="folder holding the benchmark scripts (default: benchmarks/ of the checkout)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark")
    parser.add_argument("--json", action="store_true", help="print the report on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress, no tables")


def find_benchmarks(explicit: Path | None) -> Path | None:
    candidates = [explicit] if explicit is not None else []
    if explicit is None:
        import zephon

        candidates += [Path(zephon.__file__).resolve().parents[2] / "benchmarks"]
        candidates += [Path.cwd() / "benchmarks"]
    for c in candidates:
        if c is not None and c.is_dir() and any(c.glob("*.py")):
            return c.resolve()  # the scripts run in a scratch folder
    return None


def last_json_line(text: str) -> Any:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def numeric_leaves(data: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Flatten a benchmark's JSON into (key path, number) pairs for plotting."""
    out: list[tuple[str, float]] = []
    if isinstance(data, dict):
        for k, v in data.items():
            out += numeric_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += numeric_leaves(v, f"{prefix}[{i}]")
    elif isinstance(data, int | float) and not isinstance(data, bool):
        out.append((prefix, float(data)))
    return out


def plot(report: dict[str, Any], folder: Path) -> list[Path]:
    """One horizontal bar chart (log scale) per benchmark of its numeric results."""
    matplotlib = require("matplotlib", "zephon bench plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, entry in report["benchmarks"].items():
        values = [(k, v) for k, v in numeric_leaves(entry.get("result")) if v > 0][:40]
        if not values:
            continue
        fig, ax = plt.subplots(figsize=(9, 0.28 * len(values) + 1.2))
        ax.barh([k for k, _ in values], [v for _, v in values], color="#4c72b0")
        ax.set_xscale("log")
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(f"zephon bench: {name}")
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def _selected(args: argparse.Namespace) -> tuple[Path, list[str]] | int:
    """The benchmarks folder and the names to run, or the exit code of a usage error."""
    folder = find_benchmarks(args.benchmarks_dir)
    if folder is None:
        return fail(
            "bench",
            "no benchmarks/ folder found; run from a zephon source checkout or pass "
            "--benchmarks-dir",
            EXIT_USAGE,
        )
    names = args.only or list(SMALL)
    unknown = [n for n in names if not (folder / f"{n}.py").is_file()]
    if unknown:
        have = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
        return fail("bench", f"unknown benchmark(s) {unknown}; available: {have}", EXIT_USAGE)
    return folder, names


def _new_report(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "format": "zephon.bench-report",
        "version": 1,
        "zephon": _version(),
        "python": platform.python_version(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sizes": "full" if args.full else "small",
        "benchmarks": {},
    }


def _run_one(
    folder: Path, name: str, tmp: str, args: argparse.Namespace
) -> tuple[dict[str, Any], str]:
    """Run one benchmark script in ``tmp``: its report entry and its standard output."""
    extra = [] if args.full else [a.format(tmp=tmp) for a in SMALL.get(name, [])]
    cmd = [sys.executable, str(folder / f"{name}.py"), *extra]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=args.timeout)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -1, str(exc.stdout or ""), f"timed out after {args.timeout} s"
    result = last_json_line(out) if code == 0 else None
    entry = {
        "args": extra,
        "seconds": round(time.perf_counter() - start, 2),
        "returncode": code,
        "result": result,
        "error": None if result is not None else _last_error(err),
    }
    return entry, out


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def _last_error(stderr: str) -> str:
    """The last line of a failed benchmark's stderr; a missing optional package as the
    ``pip install 'zephon[EXTRA]'`` that installs it."""
    last = (stderr.strip().splitlines() or ["?"])[-1]
    missing = _MISSING.search(last)
    if missing is None:
        return last
    top = missing.group(1).partition(".")[0]
    extra = EXTRA_OF.get(top)
    install = f"pip install 'zephon[{extra}]'" if extra else f"pip install {top}"
    return f"needs {top}, which is not installed: {install}"


def _run_all(
    folder: Path, names: list[str], report: dict[str, Any], args: argparse.Namespace, console: Any
) -> list[str]:
    """Run ``names`` under a progress bar, filling ``report``; the names that failed."""
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    failed = []
    with (
        tempfile.TemporaryDirectory(prefix="zephon-bench-") as tmp,
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
            disable=args.quiet,
        ) as progress,
    ):
        task = progress.add_task("benchmarks", total=len(names))
        for name in names:
            progress.update(task, description=f"bench {name}")
            entry, out = _run_one(folder, name, tmp, args)
            report["benchmarks"][name] = entry
            if entry["result"] is None:
                failed.append(name)
            if not args.quiet and not args.json:
                table = "\n".join(ln for ln in out.splitlines() if not ln.startswith("{"))
                head = f"[bold]{name}[/] ({entry['seconds']:.1f} s)\n{escape(table)}"
                progress.console.print(head)
                if entry["error"]:
                    progress.console.print(f"[red]{name} failed:[/] {escape(entry['error'])}")
            progress.advance(task)
    return failed


def _write_report(report: dict[str, Any], args: argparse.Namespace, console: Any) -> None:
    """Plot (when matplotlib is there), write the report and say where it went."""
    from rich.markup import escape

    plots_dir = args.plots or args.out.parent / "bench-plots"
    try:
        pngs = plot(report, plots_dir)
        report["plots"] = [str(p) for p in pngs]
    except MissingDependencyError as exc:
        report["plots"] = []
        report["plots_note"] = str(exc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, json.dumps(report, indent=1) + "\n")
    if args.json:
        print(json.dumps(report))
        return
    console.print(f"report: {args.out}")
    if report["plots"]:
        console.print(f"plots: {plots_dir} ({len(report['plots'])} PNG)")
    else:
        console.print(escape(report.get("plots_note", "no plots")))


def run(args: argparse.Namespace) -> int:
    from zephon.cli._report import console as log_console

    selected = _selected(args)
    if isinstance(selected, int):
        return selected
    folder, names = selected
    console = log_console(stderr=True)
    report = _new_report(args)
    failed = _run_all(folder, names, report, args, console)
    _write_report(report, args, console)
    if failed:
        return fail("bench", f"benchmark(s) failed: {', '.join(failed)}", EXIT_FAILURE)
    return EXIT_OK


def _version() -> str:
    from zephon import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zephon bench")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
