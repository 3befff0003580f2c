"""Stop, checkpoint (through JSON) and restore a pipeline repeatedly; shared by resume tests.

The helper itself ships in :mod:`zephon.testing`, so users prove their pipelines with it too.
"""

from __future__ import annotations

from zephon.testing import run_with_stops

__all__ = ["run_with_stops"]
