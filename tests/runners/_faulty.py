"""An operator that kills the worker running it (SIGKILL) when it sees a chosen record."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem


class KillWorkerOp(BaseOp):
    """SIGKILLs its own process on record ``victim``: once (a marker file remembers) or always
    (the marker gets the pid of every process killed, one a line).

    Never run it inline: it would kill the test process.
    """

    name = "kill_worker"

    def __init__(self, marker: Path, victim: int, *, always: bool = False) -> None:
        super().__init__()
        self.marker = str(marker)
        self.victim = victim
        self.always = always

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(8)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=2)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        ids = {int(e.payload["id"]) for e in elems if isinstance(e, SampleRecord)}
        if self.victim in ids and (self.always or not os.path.exists(self.marker)):
            with open(self.marker, "a") as f:  # one line per kill: the pid killed
                f.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return [SampleRecord(e.meta, {**e.payload, "checked": True}) for e in elems]

    def config(self) -> dict[str, Any]:
        return {"victim": self.victim}


class FailWhileArmedOp(BaseOp):
    """Fails on record ``victim`` (any record when None) for as long as the file ``armed``
    exists.

    ``how``: "raise" (a ValueError, like a bug in user code), "interrupt" (KeyboardInterrupt,
    like Ctrl-C landing inside the engine) or "exit" (the worker process dies; process runner
    only). Deleting ``armed`` is "fixing the cause": the same operator then passes records on.
    """

    name = "fail_while_armed"

    def __init__(self, armed: Path, victim: int | None, how: str = "raise") -> None:
        super().__init__()
        self.armed = str(armed)
        self.victim = victim
        self.how = how

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(8)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=2)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        ids = {int(e.payload["id"]) for e in elems if isinstance(e, SampleRecord)}
        hit = self.victim in ids if self.victim is not None else bool(ids)
        if hit and os.path.exists(self.armed):
            if self.how == "exit":
                os._exit(13)
            if self.how == "interrupt":
                raise KeyboardInterrupt
            raise ValueError(
                f"record {self.victim if self.victim is not None else min(ids)} is bad"
            )
        return list(elems)

    def config(self) -> dict[str, Any]:
        return {"victim": self.victim}


class StopWorkerOp(KillWorkerOp):
    """SIGSTOPs its own process on record ``victim``: alive, but silent for ever (as on a hung
    NFS read or a deadlock in a C extension). Once (a marker file remembers) or always."""

    name = "stop_worker"

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        ids = {int(e.payload["id"]) for e in elems if isinstance(e, SampleRecord)}
        if self.victim in ids and (self.always or not os.path.exists(self.marker)):
            Path(self.marker).touch()
            os.kill(os.getpid(), signal.SIGSTOP)
        return [SampleRecord(e.meta, {**e.payload, "checked": True}) for e in elems]
