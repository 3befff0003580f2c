"""One shared-memory file per item for what a DataLoader worker sends its training process.

torch sends each tensor a worker yields through shared memory of its own: a file descriptor
passed over a fresh, authenticated socket connection, received and mapped in the training
process, ten tensors per ``to_training`` batch. Here a worker writes every array and tensor of a
dict payload into one file in the shm directory (its own cost) and sends the file's name; the
training process maps it, removes the name at once (the mapping keeps the memory) and takes
views: same dtypes, shapes and values, numpy arrays staying numpy arrays.

Files are named ``zephon-shm-<training process pid>-loader<token>-...``: the loader removes
those its workers wrote but it never received when an iteration ends, and a run killed before
that leaves files that the next zephon engine sweeps (the pid is gone).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import mmap
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from zephon._engine.handoff.shm import NAME_PREFIX, segment_files, shm_dir

_ALIGN = 64  # each array starts on a cache line, so every dtype's view is aligned
_COUNTER = itertools.count()


@dataclass(frozen=True)
class _Slot:
    """Where one array lies in the file, and whether it was a torch tensor."""

    offset: int
    nbytes: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    tensor: bool


@dataclass(frozen=True)
class SharedPayload:
    """A dict payload whose arrays lie in the shm file ``name``; other values in ``rest``."""

    name: str
    size: int
    slots: dict[str, _Slot]
    rest: dict[str, Any]
    order: tuple[str, ...]

    def pin_memory(self) -> dict[str, Any]:
        """The payload in one page-locked block (a DataLoader with ``pin_memory=True`` calls
        this on its pinning thread, not the training thread): one copy for the whole item,
        and every tensor a view of that block, ready for ``non_blocking`` device copies."""
        block = torch.empty(self.size, dtype=torch.uint8, pin_memory=True)
        return self.copied_into(block)

    def copied_into(self, block: torch.Tensor) -> dict[str, Any]:
        """The payload with its arrays copied into ``block`` (``size`` bytes) as views of it."""
        block.numpy()[:] = np.frombuffer(_map(self.name, self.size), dtype=np.uint8)
        flat = block.numpy()
        return _views(self, flat, lambda slot: _torch_view(block, slot))


@functools.cache
def _dir() -> str:
    return str(shm_dir())


def new_prefix() -> str:
    """The file-name prefix of one iteration's items (this process's pid, a fresh token)."""
    return f"{NAME_PREFIX}{os.getpid()}-loader{secrets.token_hex(4)}-"


def remove_left(prefix: str) -> None:
    """Remove the files of ``prefix`` that were written but never received."""
    for name in segment_files(prefix):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(_dir(), name))


def _as_array(value: Any) -> np.ndarray | None:
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.device.type != "cpu":
            return None
        try:
            return value.detach().numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16): torch sends it on its own
            return None
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value
    return None


def _write(path: str, size: int, arrays: dict[str, np.ndarray], slots: dict[str, _Slot]) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            flat = np.frombuffer(mm, dtype=np.uint8)
            for key, array in arrays.items():
                slot = slots[key]
                view = flat[slot.offset : slot.offset + slot.nbytes].view(array.dtype)
                view.reshape(array.shape)[...] = array
            del flat, view
    finally:
        os.close(fd)


def _layout(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> SharedPayload:
    """Where each of ``arrays`` (of ``payload``) lies in one block (its file still unnamed)."""
    slots: dict[str, _Slot] = {}
    size = 0
    for key, array in arrays.items():
        tensor = isinstance(payload[key], torch.Tensor)
        slots[key] = _Slot(size, array.nbytes, array.dtype, array.shape, tensor)
        size += -(-array.nbytes // _ALIGN) * _ALIGN
    rest = {key: value for key, value in payload.items() if key not in slots}
    return SharedPayload("", max(size, _ALIGN), slots, rest, tuple(payload))


def _arrays(payload: dict[str, Any]) -> dict[str, np.ndarray]:
    return {key: a for key, value in payload.items() if (a := _as_array(value)) is not None}


def pack(payload: Any, prefix: str) -> Any:
    """``payload`` with its arrays in one shm file named from ``prefix`` when it is a dict
    holding at least two of them (one array gains nothing); anything else unchanged."""
    if type(payload) is not dict:
        return payload
    arrays = _arrays(payload)
    if len(arrays) < 2:
        return payload
    layout = _layout(payload, arrays)
    name = f"{prefix}{os.getpid()}-{next(_COUNTER)}"
    _write(os.path.join(_dir(), name), layout.size, arrays, layout.slots)
    return replace(layout, name=name)


def _pinned_block(size: int) -> torch.Tensor:
    return torch.empty(size, dtype=torch.uint8, pin_memory=True)


def pinned(
    payload: Any, allocate: Callable[[int], torch.Tensor] = _pinned_block
) -> dict[str, Any] | Any:
    """A dict ``payload`` with its arrays and CPU tensors copied into one block from
    ``allocate(size)`` (page-locked by default): one allocation and one pass of copies per
    item, every tensor a view of the block; anything else unchanged."""
    if type(payload) is not dict:
        return payload
    arrays = _arrays(payload)
    if not arrays:
        return payload
    layout = _layout(payload, arrays)
    block = allocate(layout.size)
    flat = block.numpy()
    for key, array in arrays.items():
        slot = layout.slots[key]
        flat[slot.offset : slot.offset + slot.nbytes].view(array.dtype).reshape(array.shape)[
            ...
        ] = array
    return _views(layout, flat, lambda slot: _torch_view(block, slot))


def pinned_items(items: Iterator[Any]) -> Iterator[Any]:
    """``items`` each in page-locked memory (:func:`pinned`) when CUDA is available; as they
    are without it (there is no device to copy them to without blocking)."""
    if not torch.cuda.is_available():
        return items
    return _pinning(items)


def _pinning(items: Iterator[Any]) -> Iterator[Any]:
    try:
        for item in items:
            yield pinned(item)
    finally:
        close = getattr(items, "close", None)
        if close is not None:  # stop the pipeline with the consumer
            close()


def _map(name: str, size: int) -> mmap.mmap:
    """Map the file and remove its name: the mapping keeps the memory while views hold it."""
    path = os.path.join(_dir(), name)
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
        os.unlink(path)


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _torch_view(block: torch.Tensor, slot: _Slot) -> torch.Tensor:
    """Slot ``slot`` of ``block`` as a tensor sharing its storage."""
    part = block[slot.offset : slot.offset + slot.nbytes]
    return part.view(_torch_dtype(slot.dtype)).view(slot.shape)


def _views(
    payload: SharedPayload, flat: np.ndarray, tensor: Callable[[_Slot], torch.Tensor]
) -> dict[str, Any]:
    """The payload's dict, its arrays views of ``flat`` (tensors as ``tensor`` makes them)."""
    out: dict[str, Any] = {}
    for key in payload.order:
        slot = payload.slots.get(key)
        if slot is None:
            out[key] = payload.rest[key]
        elif slot.tensor:
            out[key] = tensor(slot)
        else:
            out[key] = flat[slot.offset : slot.offset + slot.nbytes].view(slot.dtype)
            out[key] = out[key].reshape(slot.shape)
    return out


def unpack(payload: Any) -> Any:
    """The dict :func:`pack` was given, its arrays now views of the mapped file."""
    if not isinstance(payload, SharedPayload):
        return payload
    flat = np.frombuffer(_map(payload.name, payload.size), dtype=np.uint8)

    def tensor(slot: _Slot) -> torch.Tensor:
        view = flat[slot.offset : slot.offset + slot.nbytes].view(slot.dtype)
        return torch.from_numpy(view.reshape(slot.shape))

    return _views(payload, flat, tensor)
