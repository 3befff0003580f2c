"""One shared-memory block per item for what a DataLoader worker sends its training process.

torch sends each tensor a worker yields through shared memory of its own: a file descriptor
passed over a socket, received and mapped in the training process, about 75 us of that
process's CPU per tensor, ten tensors per ``to_training`` batch. Here a worker copies every
array and tensor of a mapping payload into one shared tensor (its own cost), so the training
process receives one descriptor per item and takes views of it: same dtypes, shapes and
values, numpy arrays staying numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_ALIGN = 64  # each array starts on a cache line, so every dtype's view is aligned


@dataclass(frozen=True)
class _Slot:
    """Where one array lies in the block, and whether it was a torch tensor."""

    offset: int
    nbytes: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    tensor: bool


@dataclass(frozen=True)
class SharedPayload:
    """A mapping payload whose arrays lie in ``block``; the other values are in ``rest``."""

    block: torch.Tensor
    slots: dict[str, _Slot]
    rest: dict[str, Any]
    order: tuple[str, ...]


def _as_array(value: Any) -> np.ndarray | None:
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_cuda:
            return None
        try:
            return value.detach().numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16): torch sends it on its own
            return None
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and not value.dtype.hasobject:
        return value
    return None


def pack(payload: Any) -> Any:
    """``payload`` with its arrays in one shared block when it is a dict holding at least two
    of them (one array gains nothing); anything else unchanged."""
    if type(payload) is not dict:
        return payload
    arrays = {key: a for key, value in payload.items() if (a := _as_array(value)) is not None}
    if len(arrays) < 2:
        return payload
    slots: dict[str, _Slot] = {}
    size = 0
    for key, array in arrays.items():
        tensor = isinstance(payload[key], torch.Tensor)
        slots[key] = _Slot(size, array.nbytes, array.dtype, array.shape, tensor)
        size += -(-array.nbytes // _ALIGN) * _ALIGN
    block = torch.empty(max(size, 1), dtype=torch.uint8)
    flat = block.numpy()
    for key, array in arrays.items():
        slot = slots[key]
        view = flat[slot.offset : slot.offset + slot.nbytes].view(array.dtype)
        view.reshape(array.shape)[...] = array
    block.share_memory_()  # type: ignore[no-untyped-call]
    rest = {key: value for key, value in payload.items() if key not in slots}
    return SharedPayload(block, slots, rest, tuple(payload))


def unpack(payload: Any) -> Any:
    """The mapping :func:`pack` was given, its arrays now views of the shared block."""
    if not isinstance(payload, SharedPayload):
        return payload
    flat = payload.block.numpy()
    out: dict[str, Any] = {}
    for key in payload.order:
        slot = payload.slots.get(key)
        if slot is None:
            out[key] = payload.rest[key]
            continue
        array = flat[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)
        out[key] = torch.from_numpy(array) if slot.tensor else array
    return out
