"""Shared-memory transport for numpy payloads crossing process boundaries (no torch needed).

Pickling a 1 MiB array to a worker costs a copy into the pickle, a socket write, a socket read
and another copy. Here large arrays (``nbytes >= min_bytes``) found anywhere in a message are
written once into a *segment* (a file in ``/dev/shm``, one per message) and the pickle carries
only ``(segment, offset, dtype, shape)``. Receivers map the segment: a worker gets plain arrays
(views on the mapping, zero-copy); the engine process gets lazy :class:`ShmArrayRef` handles it
resolves only where a payload is read (threads and driver workers, accumulators with
``reads_payload=True``, the tail before the consumer). An array that only passes through (an
unchanged input array in a worker's output, or a resolved view shipped on to the next stage) is
sent as the same handle again, never copied.

Lifetime: the engine process owns every segment (its pid is in the name). A segment's file is
unlinked when the last mapping of it in the engine process goes away (handles and resolved views
keep it), and every file of an engine is unlinked when the engine closes, at interpreter exit,
and on a SIGTERM that kills the process (never on one a handler turns into a graceful stop:
in-flight and retried micro-batches still read them). Another process that maps a segment (the
consumer of an engine process) never unlinks it.
Names are ``zephon-shm-<owner pid>-<engine token>-...``. Each engine holds an ``flock`` on its
``...-lock`` file for its whole life, so files left by a killed run are found and removed when
the next engine starts, and the live segments of a run in another PID namespace sharing
``/dev/shm`` (containers with ``--ipc=host``), whose pid means nothing here, are never touched.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import functools
import io
import itertools
import math
import mmap
import os
import pickle
import secrets
import signal
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from zephon._exit import at_exit
from zephon._snapshot_codec import register_array_view
from zephon.types import ContributorRef, SampleBatch, SampleCursor, SampleRecord, StreamItem

NAME_PREFIX = "zephon-shm-"
LOCK_SUFFIX = "lock"  # DIR/<session prefix>lock: flocked by the live engine of that session
DEFAULT_MIN_BYTES = 64 * 1024
RECYCLED = "r"  # the last letter of a recycled segment's name
RECYCLED_MIN_BYTES = 1024  # the size from which an array goes to a recycled segment
_ALIGN = 64


def shm_dir() -> Path:
    """Where segments live: ``/dev/shm`` (RAM) on Linux, the temp dir elsewhere."""
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


class SegmentLostError(RuntimeError):
    """A segment a micro-batch refers to was removed while the run still needed it."""


def lost_segment(exc: FileNotFoundError) -> SegmentLostError:
    """The error for a message whose segment file is gone (``exc`` from mapping it)."""
    return SegmentLostError(
        f"shared-memory segment {exc.filename} of a micro-batch was removed while the run "
        f"still needed it (something deleted files of a live run from {shm_dir()}: a cleanup "
        "job, or another program); the worker did not crash. Keep cleanups away from "
        "zephon-shm-* files of running jobs, then resume the run"
    )


# -- process-wide state ----------------------------------------------------------------------

_OWNER = True  # False in worker processes: they never unlink a segment the engine may hold
_RESOLVE_ON_LOAD = False  # True in worker processes: unpickle straight to arrays
_LOCK = threading.Lock()
_MAPS: weakref.WeakValueDictionary[str, mmap.mmap] = weakref.WeakValueDictionary()
_VIEWS: dict[int, tuple[weakref.ref[np.ndarray], tuple[Any, ...]]] = {}


def enter_worker_mode() -> None:
    """Called first thing in a worker process."""
    global _OWNER, _RESOLVE_ON_LOAD
    _OWNER = False
    _RESOLVE_ON_LOAD = True


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@functools.cache
def _dir() -> str:
    return str(shm_dir())


def _map(name: str) -> mmap.mmap:
    """This process's mapping of segment ``name`` (shared by every view and handle on it)."""
    with _LOCK:
        mm = _MAPS.get(name)
        if mm is not None:
            return mm
        path = os.path.join(_dir(), name)
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        _MAPS[name] = mm
        if _OWNER and name.startswith(f"{NAME_PREFIX}{os.getpid()}-"):
            # Only the process named in the segment owns it: a consumer of an engine process
            # maps segments the engine may still send again, so it must not unlink them.
            # not at exit: close_all removes it then, with Ctrl-C held
            weakref.finalize(mm, _unlink, path).atexit = False
        return mm


def _forget_view(key: int, wr: weakref.ref[Any]) -> None:
    entry = _VIEWS.get(key)
    if entry is not None and entry[0] is wr:
        _VIEWS.pop(key, None)


def _view(args: tuple[Any, ...]) -> np.ndarray:
    name, offset, dtype, shape = args
    if _RESOLVING.on and name[-1] == RECYCLED:
        dt = np.dtype(dtype)
        end = offset + math.prod(shape) * dt.itemsize
        return np.ndarray(shape, dt, buffer=_block(name, end), offset=offset)
    arr: np.ndarray = np.ndarray(shape, np.dtype(dtype), buffer=_map(name), offset=offset)
    if _RESOLVING.on:  # the final consumer: it never sends the view on
        return arr
    key = id(arr)
    wr: weakref.ref[np.ndarray] = weakref.ref(arr, functools.partial(_forget_view, key))
    _VIEWS[key] = (wr, args)
    return arr


# -- recycled segments, on the final consumer's side ----------------------------------------

_HELD: dict[str, mmap.mmap] = {}  # this process's mapping of each recycled segment it got
_HOLDERS: dict[str, int] = {}  # recycled segment -> buffers of it with views left
_REFS: dict[int, weakref.ref[Any]] = {}  # by id: a buffer (and so its ref) is unhashable
_HOLD_LOCK = threading.RLock()  # weakref callbacks may run inside a locked section


def _block(name: str, end: int) -> Any:
    """This message's buffer on recycled segment ``name`` (``end`` bytes at least): when no
    view of it is left, the name goes to the receiver's released list."""
    blocks = _RESOLVING.blocks
    block = blocks.get(name)
    if block is not None and len(block) >= end:
        return block
    mm = _HELD.get(name)
    if mm is None or len(mm) < end:  # first seen, or grown by the engine since
        path = os.path.join(_dir(), name)
        fd = os.open(path, os.O_RDWR)
        try:
            mm = _HELD[name] = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    block = blocks[name] = (ctypes.c_char * len(mm)).from_buffer(mm)
    released = _RESOLVING.released
    with _HOLD_LOCK:
        _HOLDERS[name] = _HOLDERS.get(name, 0) + 1
        ref = weakref.ref(block, functools.partial(_let_go, name, released))
        _REFS[id(ref)] = ref
    return block


def _let_go(name: str, released: list[str], ref: weakref.ref[Any]) -> None:
    with _HOLD_LOCK:
        _REFS.pop(id(ref), None)
        left = _HOLDERS[name] = _HOLDERS[name] - 1
        if not left:
            del _HOLDERS[name]
            released.append(name)


def forget_held(prefix: str) -> None:
    """Drop this process's mappings of the recycled segments of ``prefix`` (their engine
    process is gone; views still held keep their memory)."""
    with _HOLD_LOCK:
        for name in [n for n in _HELD if n.startswith(prefix)]:
            del _HELD[name]


class ShmArrayRef:
    """A lazy handle on an array in a shared-memory segment; ``resolve()`` maps it (no copy).

    Foreign picklers (Ray, plain ``pickle``) get the array itself, copied out.
    """

    __slots__ = ("_mm", "args")

    def __init__(self, mm: mmap.mmap, args: tuple[Any, ...]) -> None:
        self._mm = mm  # keeps the segment alive
        self.args = args

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.args[3])

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = np.dtype(self.args[2])
        return dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def resolve(self) -> np.ndarray:
        return _view(self.args)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.resolve()
        return arr if dtype is None else arr.astype(dtype)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (np.array, (np.array(self.resolve()),))

    def __repr__(self) -> str:
        return f"ShmArrayRef(segment={self.args[0]!r}, dtype={self.dtype}, shape={self.shape})"


register_array_view(ShmArrayRef, ShmArrayRef.resolve)  # a held payload's array, in a checkpoint


class _Resolving(threading.local):
    """Per thread: whether ``loads_resolved()`` is unpickling (arrays become views), the
    buffers of the message's recycled segments, and where their releases go."""

    on = False
    blocks: dict[str, Any] = {}
    released: list[str] = []


_RESOLVING = _Resolving()


_HANDLES_MADE = False
"""Whether this process has made a :class:`ShmArrayRef`: until it has, no payload holds one and
``resolve_items`` has nothing to look for (payloads whose arrays are all below ``min_bytes``
are not walked)."""


def _load_array(name: str, offset: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """Unpickle hook: an array view in workers, a lazy handle in the engine process."""
    global _HANDLES_MADE
    args = (name, offset, dtype, shape)
    if _RESOLVE_ON_LOAD or _RESOLVING.on:
        return _view(args)
    _HANDLES_MADE = True
    return ShmArrayRef(_map(name), args)


def _load_tensor(name: str, offset: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    """Unpickle hook of a torch tensor: a tensor sharing the segment's memory, everywhere."""
    import torch

    return torch.from_numpy(_view((name, offset, dtype, shape)))


def _tensor_from(array: np.ndarray) -> Any:
    """Unpickle hook of a small torch tensor sent as a numpy array."""
    import torch

    return torch.from_numpy(array)


def _tensor_array(obj: Any) -> np.ndarray | None:
    """The numpy view of a plain CPU tensor (torch is imported already: ``obj`` is one);
    None for what torch must pickle itself (autograd, sparse, bfloat16, conjugate views)."""
    import torch

    if obj.requires_grad or obj.device.type != "cpu" or obj.layout != torch.strided:
        return None
    try:
        array: np.ndarray = obj.numpy()
    except (TypeError, RuntimeError):
        return None
    return array


# -- encoding --------------------------------------------------------------------------------


def _dtype_token(dtype: np.dtype[Any]) -> Any:
    return dtype.str if dtype.fields is None and dtype.subdtype is None else dtype


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, encoder: Encoder) -> None:
        super().__init__(file, protocol=5)
        self.encoder = encoder

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if cls is np.ndarray:
            return self.encoder._array(obj)
        if cls is SampleCursor or cls is ContributorRef:
            # a packed row names each of its documents by both: built by tuple.__new__ on
            # either side, not by the named tuple's own Python-level __getnewargs__/__new__
            return (tuple.__new__, (cls, tuple(obj)))
        if cls is ShmArrayRef:
            self.encoder.keep.append(obj._mm)
            return (_load_array, obj.args)
        if cls.__name__ == "Tensor" and cls.__module__ == "torch":
            return self.encoder._tensor(obj)
        return NotImplemented


class Encoder:
    """Pickles messages, moving large arrays into one segment per message.

    ``recycle=True`` (the hand-off to a final consumer): a segment the receiver says it has
    released (:meth:`release`: no view of it is left there) is written again for a later
    message, so the consumer maps each file once and a message costs it no mapping; arrays
    from :data:`RECYCLED_MIN_BYTES` up then go there too (pickled, they would be copied
    through the pipe).
    """

    def __init__(self, prefix: str, min_bytes: int, *, recycle: bool = False) -> None:
        self.prefix = prefix
        self.min_bytes = max(1, min(min_bytes, RECYCLED_MIN_BYTES) if recycle else min_bytes)
        self._counter = itertools.count()
        self.keep: list[Any] = []
        self._name: str | None = None
        self._size = 0
        self._pending: list[tuple[int, np.ndarray]] = []
        self._recycle = recycle
        self._sizes: dict[str, int] = {}  # recycled segments written so far, and their sizes
        self._mapped: dict[str, mmap.mmap] = {}  # this encoder's mapping of each of them
        self._free: collections.deque[str] = collections.deque()  # released by the receiver

    def release(self, names: Iterable[str]) -> None:
        """The receiver holds no view of segments ``names`` any more (from any thread)."""
        self._free.extend(name for name in names if name in self._sizes)

    def _new_name(self) -> str:
        if not self._recycle:
            return f"{self.prefix}{next(self._counter)}"
        if self._free:
            return self._free.popleft()
        name = f"{self.prefix}{next(self._counter)}{RECYCLED}"
        self._sizes[name] = 0
        return name

    def _array(self, arr: np.ndarray) -> Any:
        if arr.nbytes < self.min_bytes or arr.dtype.hasobject:
            return NotImplemented
        entry = _VIEWS.get(id(arr))
        if entry is not None and entry[0]() is arr:
            self.keep.append(arr)  # passthrough: same segment, no copy
            return (_load_array, entry[1])
        if self._name is None:
            self._name = self._new_name()
        offset = -(-self._size // _ALIGN) * _ALIGN
        self._size = offset + arr.nbytes
        self._pending.append((offset, arr))
        return (_load_array, (self._name, offset, _dtype_token(arr.dtype), arr.shape))

    def _tensor(self, obj: Any) -> Any:
        """A torch tensor travels as its numpy array (in the segment when large) and arrives
        as a tensor on that memory: a transform run in an engine process hands over model
        inputs at no copy, and small ones cost a numpy pickle, not torch's own."""
        array = _tensor_array(obj)
        if array is None:
            return NotImplemented
        reduced = self._array(array)
        if reduced is NotImplemented:
            return (_tensor_from, (array,))
        return (_load_tensor, reduced[1])

    def dumps(self, obj: Any) -> tuple[bytes, list[Any]]:
        """The pickle of ``obj`` and what must stay alive until the receiver has mapped it."""
        self.keep = []
        self._name, self._size, self._pending = None, 0, []
        buf = io.BytesIO()
        try:
            _Pickler(buf, self).dump(obj)
            if self._pending:
                self.keep.append(self._write())
        except BaseException:
            if self._name is not None:
                self._sizes.pop(self._name, None)
                _unlink(str(shm_dir() / self._name))
            raise
        keep = self.keep
        self.keep, self._pending = [], []
        return buf.getvalue(), keep

    def _write(self) -> Any:
        assert self._name is not None
        size = self._sizes.get(self._name)
        if size is not None:
            self._write_recycled(self._name, size)
            return self._name
        path = os.path.join(_dir(), self._name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self._size)
            for offset, arr in self._pending:
                flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
                _pwrite_all(fd, flat.data, offset)
        finally:
            os.close(fd)
        return _map(self._name) if _OWNER else self._name

    def _write_recycled(self, name: str, size: int) -> None:
        """Copy the pending arrays into recycled segment ``name`` through this encoder's own
        mapping of it (kept while it lives: a copy per array, no system call per array)."""
        mapped = self._mapped.get(name)
        if mapped is None or len(mapped) < self._size:
            path = os.path.join(_dir(), name)
            flags = os.O_RDWR if size else os.O_CREAT | os.O_EXCL | os.O_RDWR
            fd = os.open(path, flags, 0o600)
            try:
                if size < self._size:  # a recycled segment only grows
                    os.ftruncate(fd, self._size)
                mapped = self._mapped[name] = mmap.mmap(fd, max(size, self._size))
            finally:
                os.close(fd)
        for offset, arr in self._pending:
            flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            np.frombuffer(mapped, np.uint8, len(flat), offset)[:] = flat
        self._sizes[name] = max(size, self._size)


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def loads_resolved(data: bytes, released: list[str] | None = None) -> Any:
    """Unpickle with every array as a view on its segment (for a final consumer: no handles
    to resolve afterwards, so no walk over the payloads). The names of recycled segments
    whose views are all gone are appended to ``released`` (for the sender to reuse)."""
    _RESOLVING.on = True
    _RESOLVING.blocks, _RESOLVING.released = {}, [] if released is None else released
    try:
        return pickle.loads(data)
    finally:
        _RESOLVING.on = False
        _RESOLVING.blocks = {}


# -- resolving handles where payloads are read ----------------------------------------------


_CONTAINERS = (ShmArrayRef, dict, list, tuple)


def _resolve_in_place(obj: Any, items: Any, depth: int) -> Any:
    """Resolve the values of a dict or list (``items``: its ``(key, value)`` pairs) in place."""
    for key, value in items:
        if type(value) in _CONTAINERS:
            new = _resolve(value, depth + 1)
            if new is not value:
                obj[key] = new
    return obj


def _resolve(obj: Any, depth: int = 0) -> Any:
    cls = type(obj)
    if cls is ShmArrayRef:
        return obj.resolve()
    if depth > 8:
        return obj
    if cls is dict:
        return _resolve_in_place(obj, obj.items(), depth)  # same keys: safe while iterating
    if cls is list:
        return _resolve_in_place(obj, enumerate(obj), depth)
    if cls is tuple:
        items = [_resolve(v, depth + 1) for v in obj]
        if any(a is not b for a, b in zip(items, obj, strict=True)):
            return tuple(items)
    return obj


def _resolve_record(record: SampleRecord) -> None:
    payload = record.payload
    cls = type(payload)
    if cls is ShmArrayRef or cls is dict or cls is list or cls is tuple:
        new = _resolve(payload)
        if new is not payload:
            record.payload = new


def resolve_items(items: Iterable[StreamItem]) -> None:
    """Replace every :class:`ShmArrayRef` in the items' payloads by its array (in place)."""
    if not _HANDLES_MADE:
        return
    for item in items:
        if type(item) is SampleBatch:
            for record in item.records:
                _resolve_record(record)
        else:
            _resolve_record(item)  # type: ignore[arg-type]


# -- sessions: naming, stale detection, cleanup ---------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def segment_files(prefix: str = NAME_PREFIX) -> list[str]:
    """Names of segment files in the shm directory that start with ``prefix``."""
    try:
        return sorted(e.name for e in os.scandir(shm_dir()) if e.name.startswith(prefix))
    except FileNotFoundError:
        return []


def _session_of(name: str) -> str | None:
    """``zephon-shm-<pid>-<token>-`` of a segment or lock file name (None for a stranger)."""
    parts = name[len(NAME_PREFIX) :].split("-", 2)
    if len(parts) < 3 or not parts[0].isdigit():
        return None
    return f"{NAME_PREFIX}{parts[0]}-{parts[1]}-"


def _session_alive(prefix: str) -> bool:
    """Whether the engine of ``prefix`` runs: its lock file is flocked (any PID namespace).
    A session without a lock file is judged by its pid (files of an older zephon)."""
    try:
        fd = os.open(str(shm_dir() / f"{prefix}{LOCK_SUFFIX}"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return _pid_alive(int(prefix[len(NAME_PREFIX) :].split("-", 1)[0]))
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def sweep_stale() -> list[str]:
    """Remove the segments of engines that are gone (a killed earlier run); return their names."""
    sessions: dict[str, list[str]] = {}
    for name in segment_files():
        prefix = _session_of(name)
        if prefix is not None:
            sessions.setdefault(prefix, []).append(name)
    removed = []
    for prefix, names in sessions.items():
        removed.extend(_sweep(prefix, names))
    return removed


def _sweep(prefix: str, names: list[str]) -> list[str]:
    if _session_alive(prefix):
        return []
    lock = f"{prefix}{LOCK_SUFFIX}"
    for name in sorted(names, key=lambda n: n == lock):  # the lock file last
        _unlink(str(shm_dir() / name))
    return names


def sweep_session(prefix: str) -> list[str]:
    """Remove every file of the engine session ``prefix`` if that engine is gone (a worker
    whose engine was killed cleans up after it)."""
    return _sweep(prefix, segment_files(prefix))


def _hold_lock(prefix: str) -> int:
    """Create and flock ``<prefix>lock``; it appears under its name already locked, so a
    sweep in another process never sees it unheld."""
    directory = shm_dir()
    tmp = str(directory / f".{prefix}{LOCK_SUFFIX}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(tmp, str(directory / f"{prefix}{LOCK_SUFFIX}"))
    return fd


_SESSIONS: set[ShmSession] = set()
_HANDLERS_INSTALLED = False


def close_all() -> None:
    """Unlink the segments and lock files of every session of this process (at exit, on
    SIGTERM, and before a stop signal ends the ``zephon`` command with ``os._exit``)."""
    for session in list(_SESSIONS):
        session.close()


def _on_sigterm(signum: int, frame: FrameType | None, previous: Any) -> None:
    if callable(previous):  # a graceful stop: the engine closes its sessions when it ends
        previous(signum, frame)
        return
    close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _forget_after_fork() -> None:
    """In a forked child the parent's sessions are not ours: never unlink them at exit, and
    drop our copies of their lock descriptors (the parent's lock stays held)."""
    for session in _SESSIONS:
        fd, session._lock_fd = session._lock_fd, None
        if fd is not None:
            os.close(fd)
    _SESSIONS.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _install_handlers() -> None:
    """Unlink our segments on SIGTERM and at exit (SIGINT unwinds through ``Engine.close``)."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    _HANDLERS_INSTALLED = True
    at_exit(close_all)
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, lambda s, f: _on_sigterm(s, f, previous))


class ShmSession:
    """The segments of one engine: a name prefix, stale sweep at start, unlink-all at close."""

    def __init__(self, min_bytes: int = DEFAULT_MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self.prefix = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-"
        self._lock_fd: int | None = _hold_lock(self.prefix)
        self._pid = os.getpid()
        sweep_stale()
        self._closed = False
        self._ids = itertools.count()
        _SESSIONS.add(self)
        _install_handlers()

    def encoder(self, tag: str, *, recycle: bool = False) -> Encoder:
        """An encoder whose segment names are unique within this session."""
        return Encoder(f"{self.prefix}{tag}{next(self._ids)}-", self.min_bytes, recycle=recycle)

    def files(self) -> list[str]:
        """This engine's segments (its lock file aside)."""
        lock = f"{self.prefix}{LOCK_SUFFIX}"
        return [name for name in segment_files(self.prefix) if name != lock]

    def close(self) -> None:
        """Unlink every segment of this engine, then its lock file; mapped views stay valid
        until dropped."""
        self._closed = True
        _SESSIONS.discard(self)
        if self._pid != os.getpid():
            return  # a forked child's copy: the segments are the parent's
        for name in self.files():
            _unlink(str(shm_dir() / name))
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            _unlink(str(shm_dir() / f"{self.prefix}{LOCK_SUFFIX}"))
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._closed
