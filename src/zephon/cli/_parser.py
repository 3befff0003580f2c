"""The ``zephon`` argument parser: argparse's errors plus "did you mean" for a mistyped
option, subcommand or choice (``--fromat`` -> ``--format``, ``exlpain`` -> ``explain``)."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterator
from typing import NoReturn

_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
_UNKNOWN = re.compile(r"unrecognized arguments: (\S+)")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors suggest the closest valid spelling."""

    def error(self, message: str) -> NoReturn:
        hint = self._suggest(message)
        super().error(f"{message}; did you mean {hint!r}?" if hint else message)

    def _suggest(self, message: str) -> str | None:
        choice = _CHOICE.search(message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2))
            return _closest(choice.group(1), options)
        unknown = _UNKNOWN.search(message)
        if unknown and unknown.group(1).startswith("--"):
            return _closest(unknown.group(1), sorted(set(_option_strings(self))))
        return None


def _closest(word: str, options: list[str]) -> str | None:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return close[0] if close else None


def _option_strings(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every ``--long`` option of ``parser`` and of its subcommands, recursively."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _option_strings(sub)
        yield from (s for s in action.option_strings if s.startswith("--"))
