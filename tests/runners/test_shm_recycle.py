"""What the hand-off to a final consumer sends through shared memory: torch tensors arrive as
tensors on the segment, and a recycled segment is written again only after the consumer has
released every view of it."""

from __future__ import annotations

import gc

import numpy as np
import torch

from zephon._engine.handoff import shm


def test_tensors_travel_in_the_segment_and_arrive_as_tensors() -> None:
    session = shm.ShmSession(min_bytes=1024)
    try:
        sent = {
            "big": torch.arange(4096, dtype=torch.int64).reshape(64, 64),
            "strided": torch.arange(4096, dtype=torch.int32).reshape(64, 64).t(),
            "small": torch.tensor([True, False]),  # below the threshold: pickled as numpy
            "bf16": torch.ones(1024, dtype=torch.bfloat16),  # no numpy dtype: torch pickles
            "grad": torch.ones(1024, requires_grad=True),  # autograd: torch pickles
        }
        data, keep = session.encoder("t").dumps(sent)
        assert len(session.files()) == 1 and len(data) < sent["big"].nbytes
        got = shm.loads_resolved(data)
        for key, value in sent.items():
            assert type(got[key]) is torch.Tensor, key
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        assert got["grad"].requires_grad
        del got, keep
    finally:
        session.close()


def message(value: int) -> dict[str, np.ndarray]:
    return {"a": np.full(512, value, dtype=np.int64), "b": np.full(300, value, dtype=np.int32)}


def test_a_segment_is_written_again_only_once_every_view_of_it_is_released() -> None:
    session = shm.ShmSession(min_bytes=1024)
    try:
        enc = session.encoder("h", recycle=True)
        released: list[str] = []
        first = shm.loads_resolved(enc.dumps(message(1))[0], released)
        name = session.files()[0]
        second = shm.loads_resolved(enc.dumps(message(2))[0], released)
        assert len(session.files()) == 2 and released == []  # the first is still held
        held_b = first["b"]
        del first
        gc.collect()
        assert released == []  # one of its views is left
        del held_b
        assert released == [name]
        enc.release(released)
        third = shm.loads_resolved(enc.dumps(message(3))[0], [])
        assert len(session.files()) == 2  # the released segment was written again
        assert np.array_equal(second["a"], message(2)["a"])  # a held one never is
        assert np.array_equal(third["a"], message(3)["a"])
        assert np.array_equal(third["b"], message(3)["b"])
        enc.release(["zephon-shm-1-not-ours-0r"])  # a name it did not write is ignored
        shm.loads_resolved(enc.dumps(message(4))[0], [])
        assert len(session.files()) == 3
    finally:
        session.close()
    assert session.files() == []


def test_a_recycled_segment_grows_for_a_larger_message() -> None:
    session = shm.ShmSession(min_bytes=1024)
    try:
        enc = session.encoder("h", recycle=True)
        released: list[str] = []
        shm.loads_resolved(enc.dumps(message(1))[0], released)  # dropped at once
        enc.release(released)
        large = {"a": np.arange(100_000, dtype=np.int64)}
        got = shm.loads_resolved(enc.dumps(large)[0], [])
        assert len(session.files()) == 1 and np.array_equal(got["a"], large["a"])
    finally:
        session.close()
