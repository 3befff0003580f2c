"""A map function that holds a run at a known point, in any runner's workers.

Records pass only once the file ``open`` exists; the first record that finds it missing
creates ``reached`` (the run has got this far) and waits. Files, not events, because process
workers share nothing else with the test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

WAIT_S = 120.0


def wait_for(path: Path, timeout: float = WAIT_S) -> bool:
    """Whether ``path`` appeared within ``timeout`` seconds (polled every 5 ms)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class Gate:
    def __init__(self, folder: Path) -> None:
        self.reached = folder / "reached"
        self.open = folder / "open"

    def __call__(self, payload: Any) -> Any:
        if not self.open.exists():
            self.reached.touch()
            wait_for(self.open)
        return payload
