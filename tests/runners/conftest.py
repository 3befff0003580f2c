"""Ray actors released and a leak check after each runner test (the Ray session itself is
the suite's, in tests/conftest.py)."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Iterator

import pytest

from tests.runners._leaks import our_segments, semaphores_mapped_by


@pytest.fixture(autouse=True)
def idle_ray_actors_released() -> Iterator[None]:
    """Actors kept for the next iteration go with the test (the session's Ray stays lean)."""
    yield
    module = sys.modules.get("zephon._engine.workers.ray_pool")
    if module is not None:
        module.release_actors()


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """After every test: no shared-memory segment and no named semaphore of ours is left."""
    before = semaphores_mapped_by(os.getpid())
    yield
    assert our_segments(os.getpid()) == []
    assert semaphores_mapped_by(os.getpid()) - before == set()
    assert multiprocessing.active_children() == []
