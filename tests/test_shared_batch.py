"""One shared-memory file per item: the training process receives views with the same dtypes,
shapes and values, numpy arrays stay numpy arrays, and no file outlives its item."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from zephon._engine.handoff.shm import segment_files
from zephon._shared_batch import (
    SharedPayload,
    new_prefix,
    pack,
    pinned,
    pinned_items,
    remove_left,
    unpack,
)


def payload() -> dict[str, object]:
    return {
        "input_ids": torch.arange(24, dtype=torch.int64).reshape(3, 8),
        "loss_mask": torch.rand(3, 8, dtype=torch.float32),
        "padding_mask": torch.tensor([[True, False, True]] * 2),
        "cu_seqlens": np.array([0, 5, 24], dtype=np.int32),
        "strided": torch.arange(16, dtype=torch.int16).reshape(4, 4).t(),
        "empty": torch.zeros((0, 8), dtype=torch.int64),
        "max_seqlen": 19,
        "use_cache": False,
        "bf16": torch.ones(2, dtype=torch.bfloat16),  # no numpy dtype: sent on its own
    }


def test_the_unpacked_payload_equals_the_packed_one_value_for_value() -> None:
    original = payload()
    prefix = new_prefix()
    got = unpack(pickle.loads(pickle.dumps(pack(original, prefix))))
    assert list(got) == list(original)
    for key, value in original.items():
        out = got[key]
        assert type(out) is type(value), key
        if isinstance(value, torch.Tensor):
            assert out.dtype == value.dtype and out.shape == value.shape, key
            assert torch.equal(out, value), key
        elif isinstance(value, np.ndarray):
            assert out.dtype == value.dtype and np.array_equal(out, value), key
        else:
            assert out == value, key
    assert segment_files(prefix) == []  # the name goes once mapped; the views keep the memory
    got["input_ids"] += 1
    assert torch.equal(got["input_ids"], original["input_ids"] + 1)  # type: ignore[operator]


def test_every_array_lies_in_one_file() -> None:
    prefix = new_prefix()
    packed = pack(payload(), prefix)
    assert isinstance(packed, SharedPayload)
    assert segment_files(prefix) == [packed.name]
    got = unpack(packed)
    pointers = {
        key: value.data_ptr() if isinstance(value, torch.Tensor) else value.ctypes.data
        for key, value in got.items()
        if key in packed.slots and key != "empty"  # an empty tensor points nowhere
    }
    start = min(pointers.values())
    for key, pointer in pointers.items():
        assert pointer - start == packed.slots[key].offset, key
        assert pointer % 64 == 0, key  # aligned for every dtype
    assert got["bf16"] is packed.rest["bf16"]


def test_files_never_received_are_removed() -> None:
    prefix = new_prefix()
    names = [pack(payload(), prefix).name for _ in range(3)]
    assert segment_files(prefix) == sorted(names)
    remove_left(prefix)
    assert segment_files(prefix) == []


def test_what_gains_nothing_is_left_as_it_is() -> None:
    prefix = new_prefix()
    single = {"input_ids": torch.arange(4)}
    assert pack(single, prefix) is single
    records = ("not", "a", "dict")
    assert pack(records, prefix) is records
    assert unpack(records) is records
    assert segment_files(prefix) == []


def test_a_pinning_thread_copies_the_item_once_into_one_block() -> None:
    # pin_memory() does this into page-locked memory; here into an ordinary block
    original = payload()
    prefix = new_prefix()
    packed = pack(original, prefix)
    block = torch.empty(packed.size, dtype=torch.uint8)
    got = packed.copied_into(block)
    assert segment_files(prefix) == []  # mapped, copied, its name removed
    for key, value in original.items():
        if isinstance(value, torch.Tensor) and key in packed.slots:
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
            assert got[key].untyped_storage().data_ptr() == block.untyped_storage().data_ptr()
        elif isinstance(value, np.ndarray):
            assert np.array_equal(got[key], value) and got[key].dtype == value.dtype
        else:
            assert got[key] is value or got[key] == value, key


KILLED_WRITER = """
import sys
import numpy as np
from zephon._shared_batch import new_prefix, pack
prefix = new_prefix()
pack({"input_ids": np.arange(4096), "labels": np.arange(4096)}, prefix)
print(prefix, flush=True)
sys.stdin.read()  # until the test kills it
"""


def test_the_files_of_a_killed_training_process_are_swept_by_the_next_engine() -> None:
    """A SIGKILLed training process removes nothing; the next engine's sweep of dead
    sessions takes its loader's files (named by that process's pid)."""
    import subprocess
    import sys

    from zephon._engine.handoff.shm import sweep_stale

    with subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        prefix = child.stdout.readline().strip()
        assert len(segment_files(prefix)) == 1
        child.kill()
        child.wait()
    assert segment_files(prefix) != []  # nothing removed them at the kill
    assert set(segment_files(prefix)) <= set(sweep_stale())
    assert segment_files(prefix) == []


def test_pinning_copies_an_item_into_one_block_with_its_values() -> None:
    original = payload()
    blocks: list[torch.Tensor] = []

    def allocate(size: int) -> torch.Tensor:  # page-locked on a GPU host: plain memory here
        blocks.append(torch.empty(size, dtype=torch.uint8))
        return blocks[-1]

    got = pinned(original, allocate)
    assert list(got) == list(original) and len(blocks) == 1
    start, end = blocks[0].data_ptr(), blocks[0].data_ptr() + blocks[0].nbytes
    for key, value in original.items():
        out = got[key]
        assert type(out) is type(value), key
        if isinstance(value, torch.Tensor) and value.dtype != torch.bfloat16:
            assert out.dtype == value.dtype and torch.equal(out, value), key
            assert out.nbytes == 0 or start <= out.data_ptr() < end, key  # a view of the block
        elif isinstance(value, np.ndarray):
            assert np.array_equal(out, value) and start <= out.ctypes.data < end, key
        elif key != "bf16":
            assert out == value, key
    assert got["bf16"] is original["bf16"]  # no numpy dtype: left as it was
    assert pinned([1, 2], allocate) == [1, 2] and len(blocks) == 1  # not a dict: unchanged


def test_pinned_items_pin_where_cuda_is_and_pass_items_through_where_it_is_not() -> None:
    items = iter([payload(), payload()])
    got = pinned_items(items)
    if torch.cuda.is_available():
        assert all(t.is_pinned() for p in got for t in p.values() if torch.is_tensor(t))
    else:
        assert got is items  # no device to copy to: nothing to pin
