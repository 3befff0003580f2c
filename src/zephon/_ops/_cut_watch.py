"""A warning, while a run goes on, when truncation cuts a large share of the tokens.

The run summary counts every cut token, but only at the end; a run that truncates most of
its corpus should say so while there is still time to stop it. The watch is shared by every
thread-worker copy of an operator (a process worker has its own), so it warns once per process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("zephon")

CUT_WARN_SHARE = 0.05  # warn once more than this share of the tokens seen is cut
CUT_WARN_MIN_TOKENS = 20_000  # ... after at least this many tokens (no noise at the start)


class CutWatch:
    """Tokens seen and cut by one operator's copies in this process; warns once."""

    def __init__(self, max_length: int | None) -> None:
        self.max_length = max_length
        self._lock = threading.Lock()
        self._seen = 0
        self._cut = 0
        self._warned = False

    def __deepcopy__(self, memo: dict[int, Any]) -> CutWatch:
        return self  # worker copies in one process count together

    def __getstate__(self) -> dict[str, Any]:
        return {"max_length": self.max_length}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["max_length"])  # type: ignore[misc]

    def add(self, op_name: str, kept: int, cut: int) -> None:
        """Count one micro-batch of operator ``op_name``: ``kept`` tokens delivered, ``cut``
        tokens truncated away."""
        if self._warned:
            return
        with self._lock:
            self._seen += kept + cut
            self._cut += cut
            if self._warned or self._seen < CUT_WARN_MIN_TOKENS:
                return
            if self._cut <= CUT_WARN_SHARE * self._seen:
                return
            self._warned = True
            seen, cut_total = self._seen, self._cut
        log.warning(
            "zephon: %s has cut %.1f%% of the tokens it has seen so far (%s of %s) by "
            "truncating documents to max_length=%s; those tokens never reach training. To "
            "keep them, tokenize with split_long_samples=True (pieces of max_length tokens) "
            "or pack with algorithm='wrap' or 'best_fit_wrap' instead of truncating",
            op_name,
            100.0 * cut_total / seen,
            f"{cut_total:,}",
            f"{seen:,}",
            self.max_length,
        )
