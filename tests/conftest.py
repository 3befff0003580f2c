"""Fixtures shared by the whole suite: generated documents, a locally trained tokenizer, one
S3-compatible server for the session, and worker processes kept for reuse released after
each test (tests share a pytest process)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tests._corpus import make_docs
from tests.io._s3 import S3
from zephon._engine.handoff import shm

# torch's OpenMP threads spin while they wait for work: with every core busy (two xdist workers,
# or a second copy of the suite beside this one) a tiny model's training step took 8x longer with
# a thread per core than with one. The tests train only tiny models, which one thread runs best.
# Set before any test imports torch; subprocesses (torchrun, docs pages) inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    """Every process the tests start gets SIGINT at its default, as a job at a terminal does.
    A suite started with SIGINT ignored (a shell script's background job) would pass that on,
    and a Ctrl-C test would see its command ignore the Ctrl-C; Python's own handler is not
    inherited (exec resets a handler to the default)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def docs() -> list[dict[str, object]]:
    return make_docs(600)


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE trained locally, saved like a transformers directory."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((str(d["text"]) for d in make_docs(500, seed=1)), trainer)
    out = tmp_path_factory.mktemp("tok")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>"})
    )
    return out


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray cluster for the whole test session: starting one takes ~10 s quiet and
    can take minutes on a loaded machine, so the first test of a pytest process that asks
    for it allows for that in its timeout."""
    import ray

    if not ray.is_initialized():
        # "local": a cluster of our own, never one another process started on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _rays_own(handler: object) -> bool:
    """``ray.init`` in this process's main thread handles SIGTERM for the session's local
    cluster on purpose (and a handler, unlike an ignored signal, is not inherited)."""
    return str(getattr(handler, "__module__", "")).startswith("ray.")


def _ignored_by_the_kernel() -> set[int]:
    """The stop signals this process ignores as the kernel sees it (``SigIgn``): a native
    library may have set that without Python's handler table knowing."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return set()
    ignored = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn"))
    return {signum for signum in STOP_SIGNALS if int(ignored, 16) >> (signum - 1) & 1}


def _stop_signal_state() -> tuple[dict[int, object], set[int], set[int]]:
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return (
        {signum: signal.getsignal(signum) for signum in STOP_SIGNALS},
        _ignored_by_the_kernel(),
        {signum for signum in STOP_SIGNALS if signum in blocked},
    )


@pytest.fixture(autouse=True)
def stop_signal_handlers_restored() -> Iterator[None]:
    """A test that leaves SIGINT or SIGTERM handled, ignored or blocked in this pytest process
    changes every later test: the subprocesses it starts inherit an ignored signal (a blocked
    one too), and a Ctrl-C test then sees its child exit 0. Restore them and fail the test
    that left them changed."""
    shm._install_handlers()  # its SIGTERM handler stays for the process's life, by design
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    before = _stop_signal_state()
    yield
    after = _stop_signal_state()
    for signum, handler in before[0].items():
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    handlers = {s: before[0][s] if _rays_own(h) else h for s, h in after[0].items()}
    assert (handlers, *after[1:]) == before, (
        "the test left SIGINT/SIGTERM changed in the pytest process: (handlers, ignored, "
        f"blocked) were {before}, are {after}"
    )


@pytest.fixture(autouse=True)
def reused_workers_released() -> Iterator[None]:
    """Process workers a test kept for reuse (``reuse_workers=True``) go with it, so the next
    test in this pytest process starts without children (tests/runners asserts exactly that,
    and checks its own tests before this runs)."""
    yield
    registry = sys.modules.get("zephon._engine.workers.worker_registry")
    if registry is not None:
        registry.shutdown_idle_workers()


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    """One moto S3 server on loopback for the session, behind the fault-injecting proxy; the
    standard AWS variables point every client (ours and the tests') at the proxy."""
    import boto3
    from moto.server import ThreadedMotoServer

    from tests.io._s3 import BUCKET, Proxy

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = Proxy(server.get_host_and_port())
    env = {
        "AWS_ACCESS_KEY_ID": "zephon-test",
        "AWS_SECRET_ACCESS_KEY": "zephon-test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": proxy.endpoint,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3", endpoint_url=proxy.endpoint)
        client.create_bucket(Bucket=BUCKET)
        yield S3(proxy, client)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proxy.close()
        server.stop()
