"""Which operator a thread is running: read from the stack of a real thread blocked inside an
operator called the way every runner calls it."""

from __future__ import annotations

import threading

from zephon._engine.state.stage import call_process_many
from zephon._running import OPERATOR_CALL, running_operator, running_operators
from zephon.ops import BaseOp
from zephon.types import StreamItem


class Blocking(BaseOp):
    name = "blocking"

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        self.entered.set()
        self.release.wait()
        return []


def test_a_thread_inside_an_operator_names_it_and_others_name_none() -> None:
    op = Blocking()
    worker = threading.Thread(target=call_process_many, args=(op, [None, None]), name="w-1")
    worker.start()
    try:
        assert op.entered.wait(60)
        assert running_operator(worker) == "blocking"
        assert running_operators() == {"w-1": "blocking"}
        assert running_operator(threading.current_thread()) is None
    finally:
        op.release.set()
        worker.join(60)
    assert running_operator(worker) is None  # ended
    assert running_operators() == {}


def test_the_call_it_looks_for_is_the_engines() -> None:
    assert call_process_many.__name__ == OPERATOR_CALL
    assert call_process_many.__module__.startswith("zephon._engine.")
