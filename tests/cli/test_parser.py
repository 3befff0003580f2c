"""The command line: every option has help text, and a mistyped option, subcommand or choice
gets "did you mean"."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator

import pytest

from tests.cli.conftest import ZEPHON
from zephon.cli import build_parser


def _actions(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}".strip())
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield path, action


def test_every_option_has_help_text() -> None:
    missing = [
        f"zephon {path} {'/'.join(a.option_strings) or a.dest}"
        for path, a in _actions(build_parser(), "")
        if not (a.help or "").strip()
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["explain", "p.yaml", "--fromat", "json"], "did you mean '--format'?"),
        (["explain", "p.yaml", "--format", "jsn"], "did you mean 'json'?"),
        (["exlpain", "p.yaml"], "did you mean 'explain'?"),
        (["run", "p.yaml", "--runner", "thread"], "did you mean 'threads'?"),
        (["run", "p.yaml", "--checkpoint-dri", "ckpt"], "did you mean '--checkpoint-dir'?"),
    ],
)
def test_mistyped_arguments_get_did_you_mean(argv: list[str], hint: str) -> None:
    proc = subprocess.run([ZEPHON, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(hint)
