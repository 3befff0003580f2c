"""The progress bar of ``zephon run`` and the demo: count, rate and, when the total is known,
the time left (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    """``12,345 docs/s`` from rich's moving-window speed of ``completed``."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f} {self.unit}/s")


class EtaColumn(TimeRemainingColumn):
    """Time left, shown only when the total is known (an unknown total has no ETA)."""

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        return Text("eta ") + super().render(task)


def progress_bar(console: Console, unit: str, *extra: ProgressColumn, **kwargs: Any) -> Progress:
    """A bar: description, bar, ``done/total UNIT``, rate, elapsed and ETA, then ``extra``."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,}" + "{task.fields[of]}" + f" {unit}"),
        RateColumn(unit),
        TimeElapsedColumn(),
        EtaColumn(),
        *extra,
        console=console,
        **kwargs,
    )


def of_total(total: int | None) -> str:
    """The ``of`` field of :func:`progress_bar` tasks: ``/20,000``, or nothing when unknown."""
    return "" if total is None else f"/{total:,}"


class WorkCount:
    """A run's progress in source samples: those whose every output was delivered or dropped
    (``RunStats.samples_done``, so samples read ahead or held in a shuffle buffer are not
    done yet) against those the work source plans for this rank's lanes, repeats of the
    faster datasets included. ``before``: samples done before the checkpoint the run resumed
    from; None when unknown, and then there is no total (never a false one)."""

    def __init__(self, pipe: Any, before: int | None = 0) -> None:
        self.pipe = pipe
        self.before = before
        self.total = planned_total(pipe) if before is not None else None

    def done(self) -> int:
        stats = self.pipe.stats()
        return (self.before or 0) + (stats.samples_done if stats is not None else 0)


def planned_total(pipe: Any) -> int | None:
    """The samples ``pipe`` reads in its current pass on its lanes; None when the work source
    cannot know (an endless stream, a source that decides as it goes)."""
    from zephon._engine.plan.compile import view_lanes

    options = pipe.runtime_options
    source = pipe.work_source.with_epoch(pipe.epoch)
    planned: int | None = source.planned_samples(view_lanes(options), options.canonical_replicas)
    return planned
