"""zephon: exactly reproducible data pipelines and durable RL token capture for LLM training."""

# No ``from __future__ import annotations`` (an import too): before the next line, Ctrl-C is
# Python's KeyboardInterrupt traceback.
from zephon._startup import install_if_command

install_if_command()  # the ``zephon`` command handles stop signals from here on

import importlib  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

if TYPE_CHECKING:
    from zephon.checkpoints import merge_checkpoints
    from zephon.distributed import gather_checkpoints
    from zephon.io import CacheOptions, Dataset
    from zephon.pipeline import Pipeline
    from zephon.provenance import trace
    from zephon.types import SampleBatch, SampleMeta, SampleRecord
    from zephon.work import (
        MixtureSchedule,
        MixtureSpec,
        StaticMixtureWorkSource,
        TokenCalibration,
        WorkChunk,
        WorkSource,
    )

# The public names, imported on first use: ``import zephon.cli`` (the ``zephon`` command) then
# costs nothing, so ``zephon run`` handles signals before numpy and the engine are loaded.
_HOMES = {
    "merge_checkpoints": "zephon.checkpoints",
    "gather_checkpoints": "zephon.distributed",
    "CacheOptions": "zephon.io",
    "Dataset": "zephon.io",
    "Pipeline": "zephon.pipeline",
    "trace": "zephon.provenance",
    "SampleBatch": "zephon.types",
    "SampleMeta": "zephon.types",
    "SampleRecord": "zephon.types",
    "MixtureSchedule": "zephon.work",
    "MixtureSpec": "zephon.work",
    "StaticMixtureWorkSource": "zephon.work",
    "TokenCalibration": "zephon.work",
    "WorkChunk": "zephon.work",
    "WorkSource": "zephon.work",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'zephon' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__version__ = "0.1.0"

__all__ = [
    "CacheOptions",
    "Dataset",
    "MixtureSchedule",
    "MixtureSpec",
    "Pipeline",
    "SampleBatch",
    "SampleMeta",
    "SampleRecord",
    "StaticMixtureWorkSource",
    "TokenCalibration",
    "WorkChunk",
    "WorkSource",
    "__version__",
    "gather_checkpoints",
    "merge_checkpoints",
    "trace",
]
