"""Errors raised by zephon. Every message says what went wrong, where, and how to fix it.

::

    ZephonError
    ├── ConfigError (ValueError)          wrong option, unknown dataset, bad weight
    │   └── MissingDependencyError (ImportError)  an optional package is not installed
    ├── DataError (ValueError)            a record or shard cannot be read
    │   ├── DataFormatError               malformed line or corrupt shard (names file and line)
    │   ├── MissingFieldError (KeyError)  a record lacks a field (names field and sample id)
    │   └── ChatFormatError               a malformed conversation (names field, turn, operator)
    ├── ContractError (RuntimeError)      an operator or accumulator broke the contract
    ├── ReorderError (RuntimeError)       a duplicate or missing micro-batch sequence number
    ├── EngineProcessError (RuntimeError) the engine process (engine_process=True) died
    ├── CheckpointError (ValueError)      a checkpoint is corrupt or from another configuration
    ├── WaitInterrupted                   the caller's check stopped a wait for the next item
    └── token capture (zephon.capture):
        ├── CaptureAdmissionRefused (ValueError)        the rollout admits no more generation
        ├── CaptureHistoryUnrepresentable (ValueError)  a history capture cannot record
        ├── TokenCaptureFrozenError (RuntimeError)      a write after the rollout's freeze
        │   └── TokenCaptureRetiredError                a write after its retirement
        ├── RolloutRetiredError (LookupError)           a read of a retired rollout
        ├── ConformanceError (AssertionError)           a store broke a contract clause
        └── LogCorruptionError (DataFormatError)        a damaged capture store log

Warnings: ``CacheThrashingWarning`` (UserWarning), a node cache too small for its working set.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "OUT_OF_MEMORY_FIX",
    "CacheThrashingWarning",
    "ChatFormatError",
    "CheckpointError",
    "ConfigError",
    "ContractError",
    "DataError",
    "DataFormatError",
    "MissingDependencyError",
    "MissingFieldError",
    "ReorderError",
    "WaitInterrupted",
    "ZephonError",
    "did_you_mean",
    "json_type",
]


class ZephonError(Exception):
    """Base class of every error zephon raises on purpose."""


OUT_OF_MEMORY_FIX = (
    "out of memory: lower the operator's parallelism, the pipeline's queue_size and "
    "max_inflight (pipeline.options()), or its batch and buffer sizes (microbatch_size, "
    "buffer_size), or raise the memory limit"
)
"""What a ``MemoryError`` raised in an operator says to change."""


class ConfigError(ZephonError, ValueError):
    """A configuration value is invalid (the message names the option or key).

    ``param``, when set, is the parameter at fault, so a YAML error can name its full key
    (``operators[1].special_tokens``).
    """

    def __init__(self, *args: object, param: str | None = None) -> None:
        super().__init__(*args)
        self.param = param


class MissingDependencyError(ConfigError, ImportError):
    """An optional package is not installed; the message names the extra that installs it.

    ``module`` is the missing top-level module, ``extra`` the ``zephon[EXTRA]`` to install.
    """

    def __init__(self, module: str, extra: str, needed_for: str) -> None:
        super().__init__(
            f"{needed_for} needs {module}, which is not installed: pip install 'zephon[{extra}]'"
        )
        self.module = module
        self.extra = extra
        self.name = module

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.module, self.extra, self._needed_for()))

    def _needed_for(self) -> str:
        return str(self).split(" needs ", 1)[0]


class DataError(ZephonError, ValueError):
    """Input data cannot be used."""


class DataFormatError(DataError):
    """A shard or record is malformed; the message names the file and line or row.

    ``location`` (the file) and ``line`` (1-based), when known, say the same for programs:
    skipped records are quarantined with them. ``hint`` (how to get past it) is appended to the
    message; ``what`` is the message without it, the reason a skipped record is logged with.
    """

    def __init__(
        self,
        message: str,
        *,
        location: str | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(f"{message}; {hint}" if hint else message)
        self.what = message
        self.location = location
        self.line = line
        self.hint = hint

    def __reduce__(self) -> tuple[object, ...]:  # keep location, line and hint across processes
        return (_rebuild_format_error, (self.what, self.location, self.line, self.hint))


def _rebuild_format_error(
    message: str, location: str | None, line: int | None, hint: str | None = None
) -> DataFormatError:
    return DataFormatError(message, location=location, line=line, hint=hint)


class MissingFieldError(DataError, KeyError):
    """A record lacks a field an operator needs (or it has the wrong type); the message names
    the field and sample id. ``sample_id``, when known, lets the command line name the file
    and line the record came from."""

    def __init__(self, message: str, *, sample_id: tuple[int, int, int] | None = None) -> None:
        super().__init__(message)
        self.sample_id = sample_id

    def __reduce__(self) -> tuple[object, ...]:  # keep sample_id across processes
        return (_rebuild_missing_field, (str(self), self.sample_id))

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def did_you_mean(value: object, choices: Iterable[object]) -> str:
    """``"; did you mean 'eos'?"`` for the choice closest to a mistyped string, else ``""``."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def json_type(value: object) -> str:
    """A value's type as a data file would say it (``null`` rather than ``NoneType``)."""
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number"}
    names.update({list: "a list", dict: "an object"})
    return names.get(type(value), type(value).__name__)


def _rebuild_missing_field(
    message: str, sample_id: tuple[int, int, int] | None
) -> MissingFieldError:
    return MissingFieldError(message, sample_id=sample_id)


class ChatFormatError(DataError):
    """A conversation cannot be rendered; the message names the operator, field and turn."""


class ContractError(ZephonError, RuntimeError):
    """An operator or accumulator broke the operator contract (see docs/operators.md)."""


class ReorderError(ZephonError, RuntimeError):
    """The reorder buffer saw a duplicate or a missing sequence number."""


class EngineProcessError(ZephonError, RuntimeError):
    """The child process running the engine (``engine_process=True``) died or could not start.

    ``exitcode`` is its exit status (negative: killed by that signal; None: unknown). What was
    delivered before stays delivered: ``pipeline.checkpoint()`` resumes right after it.
    """

    def __init__(self, message: str, *, exitcode: int | None = None) -> None:
        super().__init__(message)
        self.exitcode = exitcode

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_engine_process_error, (str(self), self.exitcode))


def _rebuild_engine_process_error(message: str, exitcode: int | None) -> EngineProcessError:
    return EngineProcessError(message, exitcode=exitcode)


class WaitInterrupted(ZephonError):
    """The check given to :meth:`zephon.Pipeline.interrupt_when` asked to stop while the
    iteration waited for its next item. Nothing was in transit: ``pipeline.checkpoint()`` is
    the state after the last item delivered."""


class CheckpointError(ZephonError, ValueError):
    """A checkpoint is corrupt, of an unknown version, or from a different configuration."""


class CacheThrashingWarning(UserWarning):
    """The node cache evicted a shard that the same run needed again (``max_bytes`` too small)."""
