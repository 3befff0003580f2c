"""How many cores this process may use: what ``parallelism="auto"`` splits among stages.

``os.cpu_count()`` counts the machine's cores, not this process's: a container or a batch job
is usually limited by its CPU affinity or a cgroup CPU quota, and a pool as wide as the
machine then only adds contention. ``ZEPHON_CPUS`` overrides what is detected.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from zephon.errors import ConfigError

ENV = "ZEPHON_CPUS"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class UsableCores:
    """``count`` cores, and ``why``: what limited them (``affinity``, a cgroup quota, ...)."""

    count: int
    why: str


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _memberships(proc_cgroup: Path) -> dict[str, str]:
    """Controller -> cgroup path of this process (``""`` names the cgroup v2 hierarchy)."""
    out: dict[str, str] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                out[controller] = parts[2].lstrip("/")
    return out


def _levels(base: Path, rel: str) -> list[Path]:
    """``base/rel`` and each of its parents up to ``base``: a quota anywhere above applies."""
    path, out = base / rel if rel else base, []
    while True:
        out.append(path)
        if path == base or base not in path.parents:
            return out
        path = path.parent


def _ratio(quota: str | None, period: str | None) -> float | None:
    """``quota / period`` in cores, or None for no limit (``max``, ``-1``) or unreadable."""
    if quota and period and quota.isdigit() and period.isdigit() and int(period) > 0:
        return int(quota) / int(period) if int(quota) > 0 else None
    return None


def _v2_quota(root: Path, rel: str) -> float | None:
    quotas = []
    for level in _levels(root, rel):
        fields = (_read(level / "cpu.max") or "").split()
        quota = _ratio(*fields) if len(fields) == 2 else None
        if quota is not None:
            quotas.append(quota)
    return min(quotas, default=None)


def _v1_quota(root: Path, rel: str) -> float | None:
    quotas = []
    for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        for level in _levels(root / mount, rel):
            quota = _ratio(_read(level / "cpu.cfs_quota_us"), _read(level / "cpu.cfs_period_us"))
            if quota is not None:
                quotas.append(quota)
    return min(quotas, default=None)


def cgroup_quota(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP
) -> tuple[float, str] | None:
    """The CPU quota of this process's cgroup in cores and where it was read, or None when
    no quota applies (or no cgroup file can be read)."""
    members = _memberships(proc_cgroup)
    if "" in members:
        quota = _v2_quota(root, members[""]) or _v2_quota(root / "unified", members[""])
        if quota is not None:
            return quota, "cgroup v2 cpu.max"
    if "cpu" in members:
        quota = _v1_quota(root, members["cpu"])
        if quota is not None:
            return quota, "cgroup v1 cpu.cfs_quota_us"
    return None


def affinity() -> int:
    """The cores this process may be scheduled on (all of them where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API on this platform (macOS)
        return os.cpu_count() or 1


def usable_cores(
    *,
    env: Mapping[str, str] | None = None,
    root: Path = CGROUP_ROOT,
    proc_cgroup: Path = PROC_CGROUP,
) -> UsableCores:
    """The cores this process may use: ``ZEPHON_CPUS`` when set, else the CPU affinity capped
    by a cgroup quota (rounded up: 1.5 cores of quota keep two threads busy part time)."""
    env = os.environ if env is None else env
    raw = env.get(ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError(f"{ENV}={raw!r}: set it to a whole number of cores >= 1, or unset it")
        return UsableCores(int(raw), ENV)
    cores = affinity()
    found = cgroup_quota(root, proc_cgroup)
    if found is not None and math.ceil(found[0]) < cores:
        return UsableCores(max(1, math.ceil(found[0])), f"{found[1]} {found[0]:g}")
    return UsableCores(cores, "affinity")
