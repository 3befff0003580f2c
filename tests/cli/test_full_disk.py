"""Disks that fail under ``zephon run`` (a real tmpfs, mounted in a mount namespace of the
test's own): a ``--record`` or ``--provenance`` log on a full disk is one line saying what to
do, with no checkpoint ahead of it, and once space is freed the resume completes it exactly; a
read-only checkpoint directory whose newest file is damaged is one line too."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import ZEPHON, without_cut_warning

SIZE = 256 * 1024
PAGE = 4096

SCRIPT = """\
set -u
mount -t tmpfs -o size={size} tmpfs small
head -c {filler} /dev/zero > small/filler
run() {{ {zephon} run pipeline.yaml --quiet --record small/rec.jsonl --checkpoint-dir ck \\
        --checkpoint-every 20 "$@"; }}
run > out1 2> err1; echo $? > code1
rm small/filler
run --resume > out2 2> err2; echo $? > code2
cp small/rec.jsonl got.jsonl
"""


def _in_mount_namespace(folder: Path, script: str) -> None:
    own = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    proc = subprocess.run(
        ["unshare", *own, "--mount", "bash", "-c", script], cwd=folder, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.mark.timeout(300)
def test_a_full_disk_under_the_record_is_one_line_and_the_resume_completes_it(workdir: Path):
    expected = subprocess.run(
        [ZEPHON, "run", "pipeline.yaml", "--quiet", "--record", "full.jsonl"], cwd=workdir,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert expected.returncode == 0, expected.stderr
    record = (workdir / "full.jsonl").read_bytes()
    assert len(record) > 2 * PAGE
    (workdir / "small").mkdir()
    free = (len(record) // 2 // PAGE) * PAGE  # room for about half the record
    script = SCRIPT.format(size=SIZE, filler=SIZE - free, zephon=ZEPHON)
    _in_mount_namespace(workdir, script)

    assert (workdir / "code1").read_text().strip() == "1"
    err = without_cut_warning((workdir / "err1").read_text())
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("zephon run: error: RecordWriteError: cannot write the ")
    assert "No space left on device" in err and "free space, then resume" in err
    assert (workdir / "code2").read_text().strip() == "0", (workdir / "err2").read_text()
    assert (workdir / "got.jsonl").read_bytes() == record


READ_ONLY = """\
set -u
mount -t tmpfs -o size=1m tmpfs ck
{zephon} run pipeline.yaml --quiet --checkpoint-dir ck --checkpoint-every 2 --max-batches 4
echo '{{"damaged' > "$(ls ck/ckpt-*.json | tail -1)"
mount -o remount,ro ck
{zephon} run pipeline.yaml --quiet --checkpoint-dir ck --resume > out 2> err; echo $? > code
"""


@pytest.mark.timeout(300)
def test_a_read_only_checkpoint_dir_with_a_damaged_newest_file_is_one_line(workdir: Path):
    (workdir / "ck").mkdir()
    _in_mount_namespace(workdir, READ_ONLY.format(zephon=ZEPHON))
    err = (workdir / "err").read_text()
    assert (workdir / "code").read_text().strip() == "2", err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("zephon run: error: ") and "Read-only file system" in err


PROVENANCE = """\
set -u
mount -t tmpfs -o size={size} tmpfs small
head -c {filler} /dev/zero > small/filler
run() {{ {zephon} run pipeline.yaml --quiet --provenance small/log --checkpoint-dir ck \\
        --checkpoint-every 20 "$@"; }}
run > out1 2> err1; echo $? > code1
ls -a small/log > parts1
ls ck > checkpoints1
rm small/filler
run --resume > out2 2> err2; echo $? > code2
cp -r small/log got
"""


@pytest.mark.timeout(300)
def test_a_full_disk_under_the_provenance_log_is_one_line_and_the_resume_completes_it(
    workdir: Path,
):
    from zephon.provenance import read_log

    expected = subprocess.run(
        [ZEPHON, "run", "pipeline.yaml", "--quiet", "--provenance", "full"], cwd=workdir,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert expected.returncode == 0, expected.stderr
    full = read_log(workdir / "full")
    steps = full["step"].to_pylist()[-1] + 1
    assert steps > 60  # several checkpoints (one part each) before the disk fills
    (workdir / "small").mkdir()
    free = 4 * 2 * PAGE  # about four parts of 20 steps (each under two pages)
    script = PROVENANCE.format(size=SIZE, filler=SIZE - free, zephon=ZEPHON)
    _in_mount_namespace(workdir, script)

    assert (workdir / "code1").read_text().strip() == "1"
    err = without_cut_warning((workdir / "err1").read_text())
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith(
        "zephon run: error: ProvenanceWriteError: cannot write the provenance log small/log: "
    )
    assert "No space left on device" in last and "free space, then resume" in last
    parts = (workdir / "parts1").read_text().split()
    assert not [p for p in parts if ".tmp-" in p]  # no half-written part is left
    kept = sorted(p for p in parts if p.startswith("part-"))
    saved = (workdir / "checkpoints1").read_text().split()
    newest = max(int(c[5:-5]) for c in saved if c.startswith("ckpt-"))
    assert kept and int(kept[-1].split("-")[2].split(".")[0]) == newest - 1  # no step ahead
    assert (workdir / "code2").read_text().strip() == "0", (workdir / "err2").read_text()
    assert read_log(workdir / "got").equals(full)


@pytest.mark.parametrize("flag", ["--record", "--provenance"])
def test_an_output_path_that_cannot_be_created_is_a_usage_error(workdir: Path, flag: str):
    (workdir / "a-file").write_text("")
    target = "a-file/inside" if flag == "--record" else "a-file/log"
    done = subprocess.run(
        [ZEPHON, "run", "pipeline.yaml", "--quiet", flag, target], cwd=workdir,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("zephon run: error: cannot open the ")
    assert "a-file/" in done.stderr and "Not a directory" in done.stderr


CHECKPOINTS = """\
set -u
mount -t tmpfs -o size={size} tmpfs ck
head -c {filler} /dev/zero > ck/filler
run() {{ {zephon} run pipeline.yaml --quiet --record rec.jsonl --checkpoint-dir ck \\
        --checkpoint-every 20 "$@"; }}
run > out1 2> err1; echo $? > code1
ls -a ck > files1
rm ck/filler
run --resume > out2 2> err2; echo $? > code2
"""


@pytest.mark.timeout(300)
def test_a_full_disk_under_the_checkpoints_names_the_file_and_the_resume_is_exact(
    workdir: Path,
):
    expected = subprocess.run(
        [ZEPHON, "run", "pipeline.yaml", "--quiet", "--record", "full.jsonl"], cwd=workdir,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert expected.returncode == 0, expected.stderr
    (workdir / "ck").mkdir()
    free = 6 * PAGE  # room for a checkpoint or two (three to four pages each)
    script = CHECKPOINTS.format(size=SIZE, filler=SIZE - free, zephon=ZEPHON)
    _in_mount_namespace(workdir, script)

    err = without_cut_warning((workdir / "err1").read_text())
    assert (workdir / "code1").read_text().strip() == "1", err
    assert "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(
        "zephon run: error: CheckpointWriteError: cannot write the checkpoint ck/ckpt-"
    )
    assert "No space left on device; free space on that disk" in err and "then resume" in err
    files = (workdir / "files1").read_text().split()
    assert [f for f in files if f.startswith("ckpt-")]  # the ones written before it filled
    assert not [f for f in files if ".tmp-" in f]
    assert (workdir / "code2").read_text().strip() == "0", (workdir / "err2").read_text()
    assert (workdir / "rec.jsonl").read_bytes() == (workdir / "full.jsonl").read_bytes()
