"""``serve``: run the proxy on one listening socket with one or several worker processes.

The socket is bound once, in the supervisor, and inherited by every worker (so ``--port 0``
works and all workers accept on the same port); each worker is a spawned process running its
own event loop, engine client and store client. A worker that dies is replaced. SIGINT or
SIGTERM stops the workers gracefully (in-flight calls finish) and then the supervisor; a
supervisor that dies (SIGKILL) takes its workers with it, each finishing its in-flight calls.
"""

from __future__ import annotations

import ipaddress
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any

from zephon.capture.proxy._config import CONFIG_ENV, ProxyConfig
from zephon.capture.stores import store_spec, url_forms

__all__ = ["bind_socket", "exposure_problem"]

log = logging.getLogger("zephon.capture.proxy")
_QUICK_DEATH_S = 10.0  # a worker that dies this soon after starting failed its startup
_MAX_QUICK_DEATHS = 3


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def exposure_problem(host: str, control_token: str | None, *, insecure: bool) -> str | None:
    """Why listening on ``host`` is refused (or, with ``insecure``, a warning); None if fine.

    Beyond loopback anyone who reaches the port could freeze, retire or delete rollouts, write
    captures under any rollout id and use the engine. A control token guards every route (the
    capture token defaults to it), so it is what a non-loopback bind needs.
    """
    if control_token or is_loopback(host):
        return None
    if insecure:
        return (
            f"warning: listening on {host} without --control-token (--insecure-no-auth): anyone "
            "who reaches this port can freeze, retire and delete rollouts, capture into any "
            "rollout and use the inference server"
        )
    return (
        f"refusing to listen on {host} without --control-token: anyone who reaches it could "
        "freeze, retire and delete rollouts, capture into any rollout and use the inference "
        "server; set --control-token (or --control-token-file; it also guards the capture and "
        "pass-through routes unless --capture-token is set), listen on 127.0.0.1, or pass "
        "--insecure-no-auth"
    )


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port"
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(app: Any, config: ProxyConfig, log_level: str, access_log: bool) -> Any:
    import uvicorn

    from zephon.capture.proxy._protocol import bounded_protocol

    return uvicorn.Config(
        app,
        http=bounded_protocol(
            header_timeout_s=config.header_timeout_s,
            body_timeout_s=config.body_timeout_s,
            max_header_bytes=config.max_header_bytes,
        ),
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=30,
    )


def _follow_supervisor(server: Any) -> None:
    """Shut the worker down gracefully once its supervisor is gone.

    A supervisor that is SIGKILLed cannot stop its workers; without this they would keep
    serving the inherited socket unsupervised and hold the port, so the proxy could not be
    restarted on it.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        log.warning("zephon capture proxy: supervisor exited; worker %d stops", os.getpid())
        server.should_exit = True

    threading.Thread(target=watch, name="zephon-proxy-supervisor-watch", daemon=True).start()


def _worker(config_env: str, sock: socket.socket, log_level: str, access_log: bool) -> None:
    import uvicorn

    from zephon.capture.proxy.app import create_app

    os.environ[CONFIG_ENV] = config_env
    config = ProxyConfig.from_env()
    server = uvicorn.Server(_uvicorn_config(create_app(config), config, log_level, access_log))
    _follow_supervisor(server)
    server.run(sockets=[sock])


def serve(
    config: ProxyConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8100,
    workers: int = 1,
    log_level: str = "warning",
    access_log: bool = False,
    insecure_no_auth: bool = False,
) -> int:
    """Serve until SIGINT/SIGTERM; prints one ``listening on`` line with the bound port."""
    import uvicorn

    from zephon.capture.proxy.app import create_app

    problem = exposure_problem(host, config.control_token, insecure=insecure_no_auth)
    if problem is not None and not insecure_no_auth:
        raise ValueError(problem)
    if problem is not None:
        log.warning("zephon capture proxy: %s", problem)
    if workers < 1:
        raise ValueError("--workers must be >= 1")
    if workers > 1 and not store_spec(config.store_url).shared_across_processes:
        raise ValueError(
            f"{store_spec(config.store_url).url_form} stores live in one process; with "
            f"--workers > 1 use a shared store ({url_forms(shared_only=True)})"
        )
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    metrics_dir = None
    if workers > 1 and config.metrics_dir is None:
        metrics_dir = tempfile.mkdtemp(prefix="zephon-proxy-metrics-")
        config = replace(config, metrics_dir=metrics_dir)
    print(
        f"zephon capture proxy listening on http://{host}:{bound} "
        f"(engine {config.engine_url}, store {config.store_url.split('?')[0]}, workers {workers})",
        flush=True,
    )
    if workers == 1:
        server = uvicorn.Server(_uvicorn_config(create_app(config), config, log_level, access_log))
        server.run(sockets=[sock])
        if not server.started:
            print("zephon capture proxy: startup failed (see the error above)", file=sys.stderr)
            return 1
        return 0
    return _supervise(config, sock, workers, log_level, access_log)


def _supervise(
    config: ProxyConfig, sock: socket.socket, workers: int, log_level: str, access_log: bool
) -> int:
    ctx = multiprocessing.get_context("spawn")
    env = config.to_env()
    stopping = False

    def start() -> Any:
        proc = ctx.Process(
            target=_worker, args=(env, sock, log_level, access_log), name="zephon-proxy-worker"
        )
        proc.start()
        return proc

    def stop(_sig: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    procs = [start() for _ in range(workers)]
    started = [time.monotonic()] * workers
    quick_deaths = 0
    status = 0
    while not stopping:
        multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0.25)
        for i, proc in enumerate(procs):
            if proc.is_alive() or stopping:
                continue
            if time.monotonic() - started[i] < _QUICK_DEATH_S:
                quick_deaths += 1
            if quick_deaths >= _MAX_QUICK_DEATHS:
                print(
                    f"zephon capture proxy: workers keep exiting right after start (last exit "
                    f"code {proc.exitcode}); giving up, see the errors above",
                    file=sys.stderr,
                    flush=True,
                )
                stopping, status = True, 1
                break
            print(
                f"zephon capture proxy: worker {proc.pid} exited ({proc.exitcode}); "
                "starting a new one",
                file=sys.stderr,
                flush=True,
            )
            procs[i], started[i] = start(), time.monotonic()
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        proc.join(timeout=35)
        if proc.is_alive():
            proc.kill()
            proc.join()
    sock.close()
    return status
