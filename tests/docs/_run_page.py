"""Run one docs page's blocks in order in the current directory (a fresh temp dir).

Usage: python _run_page.py PLAN.json. Python blocks share one namespace (like a notebook) and
may use top-level ``await``; shell blocks run with ``bash -euo pipefail``; yaml/json blocks
marked ``<!-- file: NAME -->`` are written to NAME, others are parsed; ``$ zephon ...`` lines
in text blocks are parsed by the real argument parser (not run). Before each block, and once
after the last, it writes PROGRESS (``.docs-progress.json``): a block that ends the process
itself (``os._exit``, ``zephon.distributed.exit_rank``) exits 0 with the later blocks never run,
and only that file shows it.
"""

from __future__ import annotations

import ast
import asyncio
import json
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

PROGRESS = ".docs-progress.json"


def _progress(ran: int, of: int, where: str | None) -> None:
    Path(PROGRESS).write_text(json.dumps({"ran": ran, "of": of, "where": where}))


def _fail(block: dict, message: str) -> None:
    print(f"\n{block['where']}: {block['kind']} block failed:\n{message}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    # As in a notebook: no arguments, and modules the page writes are importable.
    sys.argv = [plan[0]["where"].split(":")[0] if plan else "page"]
    sys.path.insert(0, str(Path.cwd()))
    namespace: dict = {"__name__": "__main__"}
    loop = asyncio.new_event_loop()
    for index, block in enumerate(plan):
        _progress(index, len(plan), block["where"])
        kind, code = block["kind"], block["code"]
        if block.get("file"):
            Path(block["file"]).write_text(code)
        if kind == "python":
            try:
                compiled = compile(
                    code, block["where"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
                )
                result = eval(compiled, namespace)
                if asyncio.iscoroutine(result):
                    loop.run_until_complete(result)
            except BaseException:
                _fail(block, traceback.format_exc())
        elif kind == "shell":
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True
            )
            if proc.returncode != 0:
                _fail(
                    block, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
                )
        elif kind == "yaml":
            import yaml

            try:
                yaml.safe_load(code)
            except yaml.YAMLError as exc:
                _fail(block, str(exc))
        elif kind == "json":
            try:
                json.loads(code)
            except ValueError as exc:
                _fail(block, str(exc))
        elif kind == "text":
            from zephon.cli import build_parser

            for line in code.splitlines():
                if not line.strip().startswith("$ zephon "):
                    continue
                cmd = line.strip().removeprefix("$ ")
                try:
                    build_parser().parse_args(shlex.split(cmd)[1:])
                except SystemExit as exc:
                    if exc.code != 0:
                        _fail(block, f"`{cmd}` does not parse (exit {exc.code})")
    loop.close()
    _progress(len(plan), len(plan), None)


if __name__ == "__main__":
    main()
