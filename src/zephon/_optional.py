"""Optional dependencies, imported in one place that names the extra installing each.

Core zephon needs only what ``pip install zephon`` brings; everything else is imported through
:func:`require`, so a missing one is a :class:`~zephon.errors.MissingDependencyError` that says
which ``pip install 'zephon[EXTRA]'`` fixes it instead of a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from zephon.errors import MissingDependencyError

#: Top-level module -> the extra (pyproject.toml) that installs it.
EXTRA_OF = {
    "torch": "torch",
    "torchdata": "torch",
    "ray": "ray",
    "starlette": "proxy",
    "uvicorn": "proxy",
    "httpx": "proxy",
    "psycopg": "postgres",
    "datasets": "hf",
    "huggingface_hub": "hf",
    "lance": "lance",
    "s3fs": "s3",
    "gcsfs": "gcs",
    "adlfs": "azure",
    "jinja2": "chat",
    "matplotlib": "plots",
    "statsd": "statsd",
    "PIL": "images",
    "av": "video",
    "litdata": "litdata",
    "vortex": "vortex",
}


def require(module: str, needed_for: str) -> ModuleType:
    """Import ``module``; when it (or one of its own imports) is missing, raise
    :class:`MissingDependencyError` naming the extra. ``needed_for`` says what wanted it."""
    top = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(top, EXTRA_OF.get(top, top), needed_for) from exc


def available(module: str) -> bool:
    """Whether ``module`` can be imported (for optional features that degrade gracefully)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
