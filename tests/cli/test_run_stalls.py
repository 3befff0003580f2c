"""``zephon run`` while it stalls: every worker stopped (SIGSTOP), or the object store
black-holed. The progress line says what the run waits for while nothing is delivered, and
SIGTERM ends the run (the engine's stop timers bound how long it waits; the tests print the time)
with exit 143 and a checkpoint that resumes exactly."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.cli._preempt import PREEMPT_YAML, env, lines, wait_for
from tests.cli.conftest import ZEPHON
from tests.io._stall import StallingProxy
from tests.runners._leaks import workers_of
from zephon.demo import make_corpus

BUCKET = "zephon-stall"


def start(folder: Path, err: Path, *args: str, environ: dict[str, str] | None = None) -> Any:
    """``zephon run p.yaml`` with stderr in the file ``err`` (read while the run goes on)."""
    command = [ZEPHON, "run", "p.yaml", "--quiet", *args]
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            command, cwd=folder, env=environ or env(), stdout=subprocess.PIPE, stderr=stderr,
            text=True, start_new_session=True,
        )  # fmt: skip
    _RUNS.append(proc)
    return proc


_RUNS: list[Any] = []


@pytest.fixture(autouse=True)
def no_run_left() -> Iterator[None]:
    """Runs a failed test left behind are killed (with their workers: their own session)."""
    yield
    for proc in _RUNS:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    _RUNS.clear()


def terminate(proc: Any) -> tuple[str, float]:
    """SIGTERM; the summary and the seconds until the process ended."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return out, time.monotonic() - sent


def finish(folder: Path, *args: str, environ: dict[str, str] | None = None) -> None:
    proc = start(folder, folder / "finish.err", *args, environ=environ)
    proc.communicate(timeout=300)
    assert proc.returncode == 0, (folder / "finish.err").read_text()


@pytest.mark.timeout(400)
def test_sigterm_while_every_worker_is_stopped_exits_143_then_resumes_exactly(preempt_dir):
    folder = preempt_dir
    args = ("--runner", "process")
    finish(folder, *args, "--record", "full-stopped.jsonl")
    expected = (folder / "full-stopped.jsonl").read_bytes()
    record, err = folder / "stopped.jsonl", folder / "stopped.err"
    common = (*args, "--record", record.name, "--checkpoint-dir", "ckpt-stopped")
    proc = start(folder, err, *common, "--log-every", "0.5")
    wait_for(lambda: lines(record) >= 5 or proc.poll() is not None)
    stopped = workers_of(proc.pid)
    assert stopped and proc.poll() is None
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    # the timer line names the operator and a stopped worker while nothing is delivered
    pattern = re.compile(r"waiting \d+ s for the next item: operator '[^']+' has had a "
                         r"micro-batch out for \d+ s; worker pid (\d+) busy for \d+ s")  # fmt: skip
    wait_for(lambda: pattern.search(err.read_text()) is not None or proc.poll() is not None)
    found = pattern.search(err.read_text())
    assert found is not None and int(found.group(1)) in stopped, err.read_text()
    out, took = terminate(proc)
    assert proc.returncode == 143, err.read_text()
    print(f"SIGTERM to exit: {took:.1f} s")  # measured, not asserted (the stop timers bound it)
    assert out.startswith("terminated: ") and "checkpoint: " in out
    finish(folder, *common, "--resume")
    assert record.read_bytes() == expected


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StallingProxy, str]]:
    """A moto S3 server with the preemption corpus, behind a stalling TCP proxy."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client(
        "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
        aws_access_key_id="zephon-test", aws_secret_access_key="zephon-test",
    )  # fmt: skip
    client.create_bucket(Bucket=BUCKET)
    corpus = make_corpus(tmp_path_factory.mktemp("stall") / "my-data", docs=1500, shards=30)
    for path in sorted(corpus.iterdir()):
        client.put_object(Bucket=BUCKET, Key=f"my-data/{path.name}", Body=path.read_bytes())
    proxy = StallingProxy((host, port))
    try:
        yield proxy, f"s3://{BUCKET}/my-data"
    finally:
        proxy.close()
        server.stop()


@pytest.mark.timeout(400)
def test_sigterm_while_the_store_stalls_exits_143_then_resumes_exactly(store, tmp_path):
    proxy, url = store
    (tmp_path / "p.yaml").write_text(PREEMPT_YAML.replace("path: my-data", f"path: {url}"))
    environ = {
        **env(),
        "AWS_ACCESS_KEY_ID": "zephon-test",
        "AWS_SECRET_ACCESS_KEY": "zephon-test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "ZEPHON_CACHE_DIR": str(tmp_path / "cache"),
    }
    finish(tmp_path, "--record", "full.jsonl", environ=environ)
    expected = (tmp_path / "full.jsonl").read_bytes()
    record, err = tmp_path / "stalled.jsonl", tmp_path / "stalled.err"
    common = ("--record", record.name, "--checkpoint-dir", "ckpt")
    proc = start(tmp_path, err, *common, "--log-every", "0.5", environ=environ)
    wait_for(lambda: lines(record) >= 5 or proc.poll() is not None)
    proxy.stall(after=0)  # every request from now on goes unanswered (default deadline: 60 s)
    line = re.compile(rf"waiting \d+ s for the next item: .*oldest open request: read bytes "
                      rf"\d+-\d+ of {url}/")  # fmt: skip
    wait_for(lambda: line.search(err.read_text()) is not None or proc.poll() is not None)
    assert proc.poll() is None, err.read_text()
    out, took = terminate(proc)
    assert proc.returncode == 143, err.read_text()
    print(f"SIGTERM to exit: {took:.1f} s")  # measured, not asserted (the stop timers bound it)
    assert out.startswith("terminated: ") and "checkpoint: " in out
    proxy.heal()
    finish(tmp_path, *common, "--resume", environ=environ)
    assert record.read_bytes() == expected


def hanging(folder: Path, corpus: Path, option: str) -> dict[str, str]:
    """``folder/p.yaml``: the preemption pipeline (with one more ``option`` line) with an
    operator that, given the returned environment, blocks for good (``hang_when_armed``)."""
    config = PREEMPT_YAML.replace("slow_identity", "hang_when_armed") + option
    (folder / "p.yaml").write_text(config)
    (folder / "my-data").symlink_to(corpus)
    os.mkfifo(folder / "fifo")
    return {**env(), "ZEPHON_TEST_HANG": str(folder / "fifo")}


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    ("runner", "how", "option"),
    [
        ("threads", "fifo", ""),
        ("process", "fifo", ""),
        ("inline", "fifo", ""),  # on the main thread: only the stop watch can end it
        ("inline", "mutex", ""),  # blocked in C: the Python signal handler never runs
        ("threads", "mutex", ""),
        ("threads", "fifo", "  engine_process: true\n"),  # its process is killed
    ],
)
def test_sigterm_while_an_operator_never_returns_exits_143_then_resumes_exactly(
    preempt_dir, tmp_path, runner, how, option
):
    environ = hanging(tmp_path, preempt_dir / "my-data", option)
    args = ("--runner", runner)
    finish(tmp_path, *args, "--record", "full.jsonl", environ=environ)
    expected = (tmp_path / "full.jsonl").read_bytes()
    record, err = tmp_path / "hung.jsonl", tmp_path / "hung.err"
    common = (*args, "--record", record.name, "--checkpoint-dir", "ckpt")
    armed, hung = tmp_path / "armed", tmp_path / "hung"
    stalled = {**environ, "ZEPHON_TEST_HANG_WHEN": str(armed), "ZEPHON_TEST_HUNG": str(hung)}
    if how == "mutex":
        stalled["ZEPHON_TEST_HANG"] = "mutex"
    proc = start(tmp_path, err, *common, environ=stalled)
    wait_for(lambda: lines(record) >= 5 or proc.poll() is not None, 120)
    armed.touch()  # from now on the operator never returns
    wait_for(lambda: hung.exists() or proc.poll() is not None, 120)
    assert proc.poll() is None, err.read_text()
    out, took = terminate(proc)
    assert proc.returncode == 143, err.read_text()
    print(f"SIGTERM to exit: {took:.1f} s")  # measured, not asserted (the stop timers bound it)
    assert out.startswith("terminated: ") and "checkpoint: " in out
    if runner != "process":  # a thread cannot be killed, an engine process is: a line names it
        line = r"operator '[^']*map_transform' (did not|has not) return"
        assert re.search(line, err.read_text()), err.read_text()
    finish(tmp_path, *common, "--resume", environ=environ)
    assert record.read_bytes() == expected
