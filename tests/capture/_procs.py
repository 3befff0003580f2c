"""Start writer children (``tests.capture._workload``) and collect what they acknowledged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from zephon.capture.testing import STORE_KINDS

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "read_acks", "spawn_writer", "store_url"]


def spawn_writer(url: str, plan: dict[str, Any]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.capture._workload", url, json.dumps(plan)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def read_acks(lines: list[str]) -> tuple[set[tuple[str, str]], list[str]]:
    """The (rollout, call) pairs whose put returned, and the error lines."""
    acked: set[tuple[str, str]] = set()
    errors: list[str] = []
    for line in lines:
        parts = line.split()
        if parts and parts[0] == "ok":
            acked.add((parts[1], parts[2]))
        elif parts and parts[0] == "err":
            errors.append(line.strip())
    return acked, errors


def rest_of_output(child: subprocess.Popen[str], timeout: float) -> str:
    """What a child printed after the lines already read from its stdout, once it has ended.
    Read through its text stream: ``communicate(timeout=...)`` reads the raw pipe, and loses
    the lines ``readline()`` or iteration had already buffered ahead."""
    assert child.stdout is not None
    rest = child.stdout.read()
    child.stdout.close()
    child.wait(timeout=timeout)
    return rest


def store_url(kind: str, tmp_path: Path, request: Any) -> str:
    """A fresh backend of ``kind`` from the registry (a server kind: a new schema on the
    session's PostgreSQL server)."""
    store_kind = STORE_KINDS[kind]
    server = request.getfixturevalue("pg_url") if store_kind.needs_server else None
    return store_kind.url(str(tmp_path), server)
