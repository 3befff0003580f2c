"""One Ray session for the runner tests, and a leak check after each test."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.runners._leaks import our_segments, semaphores_mapped_by


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray cluster for the whole test session (starting one takes ~10 s)."""
    import ray

    if not ray.is_initialized():
        # "local": a cluster of our own, never one another process started on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def idle_ray_actors_released() -> Iterator[None]:
    """Actors kept for the next iteration go with the test (the session's Ray stays lean)."""
    yield
    module = sys.modules.get("zephon._engine.ray_pool")
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
