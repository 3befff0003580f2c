"""Usable-core detection, from real cgroup files written under tmp_path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zephon._engine.plan.cores import affinity, cgroup_quota, usable_cores
from zephon.errors import ConfigError


def _v2(tmp_path: Path, cpu_max: str, *, parent: str | None = None) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    group = root / "job" / "step"
    group.mkdir(parents=True)
    (group / "cpu.max").write_text(cpu_max + "\n")
    if parent is not None:
        (root / "job" / "cpu.max").write_text(parent + "\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job/step\n")
    return root, proc


def _v1(tmp_path: Path, quota: int, period: int) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    group = root / "cpu,cpuacct" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (group / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "cgroup"
    proc.write_text("12:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n")
    return root, proc


def test_v2_quota_caps_the_count(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "150000 100000")
    assert cgroup_quota(root, proc) == (1.5, "cgroup v2 cpu.max")
    cores = usable_cores(env={}, root=root, proc_cgroup=proc)
    if affinity() > 2:
        assert (cores.count, cores.why) == (2, "cgroup v2 cpu.max 1.5")
    else:
        assert (cores.count, cores.why) == (affinity(), "affinity")


def test_v2_parent_quota_applies(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "max 100000", parent="100000 100000")
    assert cgroup_quota(root, proc) == (1.0, "cgroup v2 cpu.max")
    assert usable_cores(env={}, root=root, proc_cgroup=proc).count == 1


def test_v2_without_quota(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "max 100000")
    assert cgroup_quota(root, proc) is None
    assert usable_cores(env={}, root=root, proc_cgroup=proc).why == "affinity"


def test_v1_quota(tmp_path: Path) -> None:
    root, proc = _v1(tmp_path, 50000, 100000)
    assert cgroup_quota(root, proc) == (0.5, "cgroup v1 cpu.cfs_quota_us")
    cores = usable_cores(env={}, root=root, proc_cgroup=proc)
    assert cores.count == 1
    assert cores.why.startswith("cgroup v1") or affinity() == 1


def test_v1_unlimited_quota(tmp_path: Path) -> None:
    root, proc = _v1(tmp_path, -1, 100000)
    assert cgroup_quota(root, proc) is None


def test_unreadable_files_mean_no_quota(tmp_path: Path) -> None:
    assert cgroup_quota(tmp_path / "absent", tmp_path / "absent-cgroup") is None
    proc = tmp_path / "cgroup"
    proc.write_text("0::/x\n")
    (tmp_path / "cg" / "x").mkdir(parents=True)
    (tmp_path / "cg" / "x" / "cpu.max").write_text("garbage\n")
    assert cgroup_quota(tmp_path / "cg", proc) is None


def test_env_override(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "100000 100000")
    cores = usable_cores(env={"ZEPHON_CPUS": "6"}, root=root, proc_cgroup=proc)
    assert (cores.count, cores.why) == (6, "ZEPHON_CPUS")


@pytest.mark.parametrize("value", ["0", "two", "-3", "1.5"])
def test_env_override_must_be_a_count(value: str) -> None:
    with pytest.raises(ConfigError, match=rf"ZEPHON_CPUS='{value}'.*whole number"):
        usable_cores(env={"ZEPHON_CPUS": value})


def test_affinity_of_a_pinned_process(tmp_path: Path) -> None:
    code = (
        "import os; from pathlib import Path; "
        "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from zephon._engine.plan.cores import usable_cores; "
        f"c = usable_cores(env={{}}, root=Path({str(tmp_path)!r})); print(c.count, c.why)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["1", "affinity"]
