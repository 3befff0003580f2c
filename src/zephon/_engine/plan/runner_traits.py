"""What the plan knows of each runner: its traits, one class per runner, and their registry.

The plan reads these (where a stage runs and how wide, whether stages fuse, which stages a
driver thread runs), and so do the options' checks, the docs table and
``zephon.testing.check_operator``. How a runner drives a run (its pools, its threads) is the
subclass of its traits in ``run/runners.py``: a runner is one traits class here, registered in
:data:`REGISTRY`, and one runner class there.

A stage's runner in the plan is a registry name or ``"driver"``: an operator that
``runs_in_driver`` stays on its driver thread under every runner but inline.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import ClassVar

from zephon.ops import BaseOp

DRIVER = "driver"
"""The plan's runner of a stage that runs on its driver thread (``runs_in_driver``)."""


class RunnerTraits:
    """A runner's traits: class attributes say what the plan, fusion and tests need to know."""

    name: ClassVar[str]
    summary: ClassVar[str]
    """One line for the docs table."""
    pooled: ClassVar[bool] = False
    """Its stages run on a worker pool fed by a driver thread."""
    fuses: ClassVar[bool] = False
    """Adjacent element-wise stages share one worker task (their counters must reach
    ``stats()``: process workers send theirs back with each reply)."""
    width_one_on_driver: ClassVar[bool] = False
    """A unit of width one runs on its driver thread (one worker would only add hand-offs)."""
    shares_memory: ClassVar[bool] = False
    """Its stages need a shared-memory session (large arrays cross process boundaries)."""
    ships_payloads: ClassVar[bool] = False
    """Its workers send payloads back through a pipe or the network: they drop the fields
    the next operator does not read first (``BaseOp.input_projection``)."""
    in_engine_process: ClassVar[bool] = True
    """It may run inside ``engine_process=True``."""
    starts_processes: ClassVar[bool] = False
    """It starts child processes (which a daemonic process, a DataLoader worker, cannot)."""
    remote: ClassVar[bool] = False
    """Stages added with ``placement="remote"`` run on it, and its actors ask for the
    operator's ``resources``."""
    requires: ClassVar[str | None] = None
    """A module it needs (an optional extra); ``check_operator`` skips it when missing."""
    reference: ClassVar[bool] = False
    """The runner the others are compared with."""

    def available(self) -> bool:
        """Whether what it needs is installed."""
        return self.requires is None or importlib.util.find_spec(self.requires) is not None

    def stage(self, op: BaseOp, placement: str, parallelism: int) -> tuple[str, int]:
        """Where an operator's ``process_many`` runs under this runner, and how many copies."""
        if op.traits().runs_in_driver:
            return DRIVER, 1
        if placement == "remote":
            return REMOTE, parallelism
        return self.name, parallelism

    def check_widths(self, workers: Sequence[int]) -> Sequence[int]:
        """The worker counts ``check_operator`` runs it with (``workers``: the caller's)."""
        return (2,)


class InlineTraits(RunnerTraits):
    """Everything on the calling thread, stage after stage: the reference."""

    name = "inline"
    summary = "everything on the calling thread, one stage after another (the reference)"
    reference = True

    def stage(self, op: BaseOp, placement: str, parallelism: int) -> tuple[str, int]:
        return self.name, 1


class PooledTraits(RunnerTraits):
    """A source thread and one driver thread per unit; each unit's work on its pool."""

    pooled = True


class ThreadsTraits(PooledTraits):
    name = "threads"
    summary = "a thread pool per operator in this process (the default)"
    fuses = True
    width_one_on_driver = True

    def check_widths(self, workers: Sequence[int]) -> Sequence[int]:
        return workers


class ProcessTraits(PooledTraits):
    name = "process"
    summary = "worker processes (one shared set by default); large arrays through shared memory"
    fuses = True
    shares_memory = True
    ships_payloads = True
    starts_processes = True


class RayTraits(PooledTraits):
    name = "ray"
    summary = "Ray actors (`placement='remote'` puts one operator there under any runner)"
    in_engine_process = False
    remote = True
    ships_payloads = True
    requires = "ray"


REGISTRY: dict[str, RunnerTraits] = {
    runner.name: runner
    for runner in (InlineTraits(), ThreadsTraits(), ProcessTraits(), RayTraits())
}
"""Every runner's traits by option name, in the order docs and checks list them."""


class _DriverStage(RunnerTraits):
    """The plan's runner of a ``runs_in_driver`` stage: no pool, no fusion (not an option)."""

    name = DRIVER
    summary = "the stage's driver thread"


_DRIVER_STAGE = _DriverStage()


def lookup(stage_runner: str) -> RunnerTraits:
    """The traits of the runner of a stage of the plan (``"driver"`` included)."""
    return REGISTRY.get(stage_runner, _DRIVER_STAGE)


def docs_table() -> str:
    """The runner table of docs/runners.md (a test keeps the two equal)."""
    lines = ["| runner | where `process_many` runs | needs |", "|---|---|---|"]
    for runner in REGISTRY.values():
        needs = f"`zephon[{runner.requires}]`" if runner.requires else "-"
        lines.append(f'| `"{runner.name}"` | {runner.summary} | {needs} |')
    return "\n".join(lines)


REMOTE = next(name for name, runner in REGISTRY.items() if runner.remote)
"""The runner of ``placement="remote"`` stages."""

REFERENCE = next(name for name, runner in REGISTRY.items() if runner.reference)
"""The runner every other one must equal."""


def available() -> tuple[str, ...]:
    """The runners whose needs are installed, in registry order."""
    return tuple(name for name, runner in REGISTRY.items() if runner.available())
