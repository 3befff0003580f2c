"""One shared block per item: the training process receives views with the same dtypes,
shapes and values, and numpy arrays stay numpy arrays."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import torch
import torch.multiprocessing  # registers torch's shared-memory reductions)

from zephon._shared_batch import SharedPayload, pack, unpack


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
    # through the pickler a DataLoader worker uses: the block travels as shared memory
    got = unpack(pickle.loads(ForkingPickler.dumps(pack(original))))
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


def test_every_array_lies_in_one_shared_block() -> None:
    packed = pack(payload())
    assert isinstance(packed, SharedPayload)
    assert packed.block.is_shared()
    got = unpack(packed)
    start = packed.block.untyped_storage().data_ptr()
    end = start + packed.block.numel()
    for key in ("input_ids", "loss_mask", "padding_mask", "strided", "cu_seqlens"):
        value = got[key]
        pointer = value.data_ptr() if isinstance(value, torch.Tensor) else value.ctypes.data
        assert start <= pointer < end, key
        assert pointer % 64 == 0, key  # aligned for every dtype
    assert got["bf16"] is packed.rest["bf16"]


def test_what_gains_nothing_is_left_as_it_is() -> None:
    single = {"input_ids": torch.arange(4)}
    assert pack(single) is single
    records = ("not", "a", "dict")
    assert pack(records) is records
    assert unpack(records) is records
