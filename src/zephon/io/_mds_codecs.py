"""MDS column encodings beyond scalars and text: ``ndarray``, images and pickles.

Decoded from MDS's documented layouts: an ``ndarray`` column is ``[dtype code: 1]`` (unless the
encoding names the dtype) ``[ndim << 2 | shape dtype code: 1] [shape]`` (unless it names the
shape) then the values; ``pil`` is ``[width, height, mode length: uint32 x 3] [mode] [pixels]``;
``jpeg`` / ``png`` hold the encoded file. Images come back as those encoded bytes, or as
``uint8`` arrays (height, width[, channels]) with ``decode_images``; ``pil`` has no encoded
form and is always an array. ``pkl`` runs ``pickle.loads`` on the data, which can execute code,
so it needs ``allow_pickle``.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from zephon._optional import require

Decoder = Callable[[bytes], Any]

_VALUE_DTYPES = {
    8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
    33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64",
}  # fmt: skip
_SHAPE_DTYPES = ("<u1", "<u2", "<u4", "<u8")


class NDArrayDecoder:
    """One ``ndarray[:DTYPE[:SHAPE]]`` column (a class, so shards pickle into workers)."""

    def __init__(self, args: list[str]) -> None:
        self.dtype = np.dtype(args[0]).newbyteorder("<") if args and args[0] else None
        self.shape = tuple(int(d) for d in args[1].split(",")) if len(args) > 1 else None

    def __call__(self, data: bytes) -> np.ndarray:
        pos = 0
        kind = self.dtype
        if kind is None:
            kind = np.dtype(_VALUE_DTYPES[data[0]]).newbyteorder("<")
            pos = 1
        dims = self.shape
        if dims is None:
            ndim, code = data[pos] >> 2, data[pos] & 3
            found = np.frombuffer(data, _SHAPE_DTYPES[code], ndim, pos + 1)
            dims = tuple(int(d) for d in found)
            pos += 1 + ndim * (1 << code)
        return np.frombuffer(data, kind, offset=pos).reshape(dims)


def _image_array(data: bytes) -> np.ndarray:
    image = require("PIL.Image", "decoding MDS image columns")
    with image.open(io.BytesIO(data)) as opened:
        return np.asarray(opened)


def _pil_array(data: bytes) -> np.ndarray:
    image = require("PIL.Image", "decoding MDS pil columns")
    width, height, mode_len = (int(x) for x in np.frombuffer(data, "<u4", 3))
    mode = data[12 : 12 + mode_len].decode("utf-8")
    return np.asarray(image.frombytes(mode, (width, height), data[12 + mode_len :]))


def extra_decoder(
    encoding: str, *, decode_images: bool, allow_pickle: bool
) -> tuple[Decoder | None, str | None]:
    """``(decoder, None)`` for an encoding of this module, ``(None, why not)`` when an option
    is missing, ``(None, None)`` when the encoding is not one of these."""
    family, _, rest = encoding.partition(":")
    if family == "ndarray":
        return NDArrayDecoder(rest.split(":") if rest else []), None
    if family in ("jpeg", "png"):
        return (_image_array if decode_images else bytes), None
    if family == "pil":
        return _pil_array, None
    if family == "pkl":
        if not allow_pickle:
            return None, "pickled (unpickling can run code): pass allow_pickle=True if you trust it"
        return pickle.loads, None
    return None, None
