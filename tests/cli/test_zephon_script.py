"""The ``zephon`` command as pip installs it (``bin/zephon``, copied as it is into a venv's
bin): Python starts with SIGINT and SIGTERM blocked, so a stop signal at any moment of
Python's own start-up is exit 130/143 with the summary once zephon's first line handles it."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli._preempt import REPO, env, wait_for
from tests.runners._leaks import workers_of

SCRIPT = REPO / "bin" / "zephon"

# imported by a .pth of the test venv while site runs, before zephon's first line: what
# ZEPHON_TEST_SITE names, in the command only (its worker processes run site too)
SITE_HOOK = """\
import os, signal, sys
_what = os.environ.get("ZEPHON_TEST_SITE", "")
if _what and os.path.basename(sys.argv[0]) == "zephon":
    if _what.startswith("record:"):
        with open(_what[len("record:"):], "w") as f:
            f.write(sys.prefix)
    else:
        os.kill(os.getpid(), getattr(signal, _what))
"""


@pytest.fixture(scope="session")
def venv_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the ``zephon`` script in its bin, as pip installs it (a script whose first
    line is not ``#!python`` is copied unchanged); its site-packages extend this one's."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True)
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.check_output([root / "bin" / "python", "-c", where], text=True).strip())
    shared = sysconfig.get_path("purelib")
    (site / "_zephon_test_site.py").write_text(SITE_HOOK)
    (site / "zephon_test.pth").write_text(
        f"import site; site.addsitedir({shared!r})\nimport _zephon_test_site\n"
    )
    shutil.copy2(SCRIPT, root / "bin" / "zephon")
    return root / "bin"


def test_pip_installs_bin_zephon_as_the_command_unchanged() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["script-files"] == ["bin/zephon"]
    assert "zephon" not in project["project"].get("scripts", {})  # pip's wrapper would clash
    assert not SCRIPT.read_bytes().startswith(b"#!python")  # pip rewrites only that line
    assert os.access(SCRIPT, os.X_OK)


def _command(venv_bin: Path, *args: str, extra_env: dict[str, str] | None = None, cwd=None):
    return subprocess.run(
        [venv_bin / "zephon", *args], cwd=cwd, env={**env(), **(extra_env or {})},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(("name", "code", "status"), [
    ("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated"),
])  # fmt: skip
def test_a_stop_signal_during_site_waits_for_the_handlers(
    venv_bin, preempt_dir, name, code, status
):
    run = ("run", "p.yaml", "--quiet")
    proc = _command(venv_bin, *run, cwd=preempt_dir, extra_env={"ZEPHON_TEST_SITE": name})
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.startswith(f"{status}: 0 items while starting") and proc.stderr == ""


def test_another_subcommand_lets_the_blocked_signal_in(venv_bin):
    """No handlers outside ``run``: the SIGTERM sent during site is let in, and kills it."""
    proc = _command(venv_bin, "--version", extra_env={"ZEPHON_TEST_SITE": "SIGTERM"})
    assert proc.returncode == -signal.SIGTERM, proc.stdout


@pytest.mark.parametrize("relative", [False, True])
def test_a_symlink_to_the_script_runs_the_python_beside_the_script(venv_bin, tmp_path, relative):
    (tmp_path / "links").mkdir()
    target = venv_bin / "zephon"  # pipx's layout: ~/.local/bin/zephon -> the venv's script
    link = os.path.relpath(target, tmp_path / "links") if relative else target
    (tmp_path / "links" / "zephon").symlink_to(link)
    record = tmp_path / "prefix"
    hook = {"ZEPHON_TEST_SITE": f"record:{record}"}
    proc = _command(tmp_path / "links", "--version", extra_env=hook)
    assert proc.returncode == 0 and proc.stdout.startswith("zephon "), proc.stderr
    assert Path(record.read_text()) == venv_bin.parent


def test_without_a_python_beside_it_the_script_runs_python3(venv_bin, tmp_path):
    (tmp_path / "user-bin").mkdir()  # a --user install: the script alone in ~/.local/bin
    shutil.copy2(venv_bin / "zephon", tmp_path / "user-bin" / "zephon")
    record = tmp_path / "prefix"
    path = f"{venv_bin}{os.pathsep}{os.environ['PATH']}"  # python3 there is the venv's
    proc = _command(
        tmp_path / "user-bin", "--version",
        extra_env={"PATH": path, "ZEPHON_TEST_SITE": f"record:{record}"},
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("zephon "), proc.stderr
    assert Path(record.read_text()) == venv_bin.parent


def test_an_env_that_cannot_block_signals_still_runs_the_command(venv_bin, tmp_path):
    """macOS, busybox, coreutils before 8.31: ``env`` rejects ``--block-signal``."""
    (tmp_path / "old").mkdir()
    fake = tmp_path / "old" / "env"
    real = shutil.which("env")
    fake.write_text(
        f'#!/bin/sh\ncase "$1" in --block-signal*) echo "env: unrecognized option" >&2; exit 125;;'
        f'\nesac\nexec {real} "$@"\n'
    )
    fake.chmod(0o755)
    path = f"{fake.parent}{os.pathsep}{os.environ['PATH']}"
    proc = _command(venv_bin, "--version", extra_env={"PATH": path})
    assert proc.returncode == 0 and proc.stdout.startswith("zephon "), proc.stderr
    assert proc.stderr == ""


def _env_that_signals_during_its_probe(folder: Path, signal_to: str) -> dict[str, str]:
    """A PATH whose ``env`` sends ``signal_to`` (kill's arguments) from the script's probe
    ``env --block-signal=INT --version``: the signal lands while sh waits on a child."""
    folder.mkdir()
    fake = folder / "env"
    fake.write_text(
        f'#!/bin/sh\ncase "$2" in --version) kill {signal_to} ;; esac\n'
        f'exec {shutil.which("env")} "$@"\n'
    )
    fake.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("signal_to", "code", "status"), [
    ("-s INT -- -$PPID", 130, "interrupted"),  # Ctrl-C: the group, the probe dies of it too
    ("-s INT $PPID", 130, "interrupted"),
    ("-s TERM $PPID", 143, "terminated"),
])  # fmt: skip
def test_a_stop_signal_while_sh_runs_is_handed_on_to_the_handlers(
    venv_bin, preempt_dir, tmp_path, signal_to, code, status
):
    path = _env_that_signals_during_its_probe(tmp_path / "bin", signal_to)
    proc = subprocess.run(
        [venv_bin / "zephon", "run", "p.yaml", "--quiet"], cwd=preempt_dir,
        env={**env(), **path}, capture_output=True, text=True, timeout=120,
        start_new_session=True,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.startswith(f"{status}: 0 items while starting") and proc.stderr == ""


@pytest.mark.timeout(300)
def test_process_workers_start_with_the_stop_signals_unblocked(venv_bin, preempt_dir):
    """The block ends in the command: its workers (forked by its forkserver) do not keep it."""
    command = [venv_bin / "zephon", "run", "p.yaml", "--quiet", "--runner", "process",
               "--checkpoint-dir", "ckpt-script-mask"]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=preempt_dir, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: bool(workers_of(proc.pid)) or proc.poll() is not None, timeout=120)
        masks = [_blocked(pid) for pid in workers_of(proc.pid)]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    stops = 1 << (signal.SIGINT - 1) | 1 << (signal.SIGTERM - 1)
    assert masks and all(mask is not None and mask & stops == 0 for mask in masks), (masks, err)
    assert proc.returncode == 143, err


def _blocked(pid: int) -> int | None:
    """The signals ``pid`` blocks (``SigBlk`` in /proc), None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigBlk:")), 16)


@dataclass
class Stop:
    delay: float
    signum: signal.Signals
    code: int
    out: str
    err: str

    def exit_status(self) -> int:
        """What a shell shows: 128 + the signal for a process the signal killed."""
        return 128 - self.code if self.code < 0 else self.code

    def ok(self) -> bool:
        if self.exit_status() != 128 + self.signum or "Traceback" in self.err:
            return False
        if self.code < 0:  # before the block (sh starting): killed, nothing printed
            return self.out == self.err == ""
        return self.out.startswith(("interrupted: ", "terminated: "))

    def describe(self) -> str:
        return (
            f"{self.signum.name} {self.delay:.3f} s in: exit {self.code}; "
            f"stdout {self.out[-200:]!r}, stderr {self.err[-400:]!r}"
        )


def _stop_at(venv_bin: Path, folder: Path, delay: float, signum: signal.Signals) -> Stop:
    proc = subprocess.Popen(
        [venv_bin / "zephon", "run", "p.yaml", "--quiet"], cwd=folder, env=env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(delay)  # the moment under test, not a wait for anything
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    return Stop(delay, signum, proc.returncode, out, err)


@pytest.mark.timeout(900)
def test_fifty_random_stop_signals_in_the_first_half_second_all_exit_130_or_143(
    venv_bin, preempt_dir
):
    """SIGINT and SIGTERM in turn at 50 random moments from the command's exec (sh, env,
    Python's start-up, zephon's imports, the first batch), 8 runs at a time: each exits 130
    or 143 with no traceback, with the summary line unless the signal killed it before the
    block (a shell shows 130/143 then too)."""
    rng = random.Random(2026)
    signals = (signal.SIGINT, signal.SIGTERM)
    moments = [(rng.uniform(0.0, 0.5), signals[i % 2]) for i in range(50)]
    with ThreadPoolExecutor(8) as pool:
        stops = list(pool.map(lambda m: _stop_at(venv_bin, preempt_dir, *m), moments))
    assert [s.describe() for s in stops if not s.ok()] == []
    killed = [s.describe() for s in stops if s.code < 0]
    print(f"{len(killed)} of {len(stops)} came before the block:", *killed, sep="\n")
