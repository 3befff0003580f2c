"""``zephon capture serve``: argument parsing only (the server stack is imported on use)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from zephon._optional import require
from zephon.errors import MissingDependencyError

__all__ = ["register_serve"]


class _RenamedOption(argparse.Action):
    """Store the value; when given under its former name (the last option string), say on
    stderr that the name is deprecated. Both names keep working."""

    append = False

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None and option_string == self.option_strings[-1]:
            print(
                f"zephon capture serve: {option_string} is deprecated; use "
                f"{self.option_strings[0]}",
                file=sys.stderr,
            )
        if self.append:
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


class _RenamedAppend(_RenamedOption):
    """A renamed option that may be given several times (each value is appended)."""

    append = True


def register_serve(capture_subparsers: Any) -> None:
    """Add ``serve`` to the ``zephon capture`` sub-command group."""
    p = capture_subparsers.add_parser(
        "serve",
        help="run the token capture proxy in front of an OpenAI-compatible inference server",
        description="Proxy /v1/chat/completions, /v1/completions and /v1/responses to the "
        "inference server; "
        "requests under /ng-rollout/<rollout_id>/training-token-capture/v1/... are captured "
        "into STORE_URL before they are answered. See docs/capture-proxy.md.",
    )
    p.add_argument(
        "--inference-server",
        "--engine",
        dest="inference_server",
        action=_RenamedAppend,
        required=True,
        metavar="URL",
        help="root URL of the inference server (vLLM, SGLang); give it several times for a "
        "fleet (each call goes to a healthy one); --engine is its deprecated alias",
    )
    p.add_argument(
        "--store",
        required=True,
        metavar="STORE_URL",
        help="capture store (memory://NAME, file:///DIR, sqlite:///FILE, postgresql://...)",
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (127.0.0.1)")
    p.add_argument("--port", type=int, default=8100, help="listen port (8100; 0 = any free)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (1)")
    p.add_argument(
        "--inference-timeout",
        "--engine-timeout",
        dest="inference_timeout",
        action=_RenamedOption,
        type=float,
        default=600.0,
        help="seconds per inference call (600); --engine-timeout is its deprecated alias",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        help="seconds to connect to the inference server",
    )
    p.add_argument(
        "--connect-retry",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a call whose connection is refused (nothing sent) is retried against "
        "the inference servers before the client gets a retryable 503 (10; 0 = one try)",
    )
    _store_arguments(p)
    _access_arguments(p)
    _limit_arguments(p)
    p.add_argument("--log-level", default="warning", help="uvicorn log level (warning)")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=_serve)


def _store_arguments(p: argparse.ArgumentParser) -> None:
    """How the proxy writes to the store: clients, delta prompts, the spill journal."""
    p.add_argument(
        "--store-clients",
        type=int,
        default=4,
        help="store clients (connections) per worker; a rollout always uses the same one (4)",
    )
    p.add_argument(
        "--delta-prompts",
        action="store_true",
        help="store a resolved continuation's prompt as the suffix after its parent's tokens",
    )
    p.add_argument(
        "--weight-version",
        type=int,
        default=None,
        help="the engine's weight version, recorded on each call that does not send the "
        "X-Zephon-Weight-Version header (default: none)",
    )
    p.add_argument(
        "--spill-dir",
        default=os.environ.get("ZEPHON_CAPTURE_SPILL_DIR"),
        metavar="DIR",
        help="local journal of incomplete marks the store could not take "
        "(env ZEPHON_CAPTURE_SPILL_DIR; default $XDG_STATE_HOME/zephon/capture-spill)",
    )
    p.add_argument(
        "--spill-replay-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between replays of the spill journal into the store (5)",
    )


def _access_arguments(p: argparse.ArgumentParser) -> None:
    """Who may call the proxy: the control and capture tokens (from an option, the
    environment or a file; the latter two keep them out of ``ps``)."""
    p.add_argument(
        "--control-token",
        default=os.environ.get("ZEPHON_CAPTURE_CONTROL_TOKEN"),
        help="bearer token for the control routes; also the capture token unless "
        "--capture-token is set (env ZEPHON_CAPTURE_CONTROL_TOKEN)",
    )
    p.add_argument(
        "--control-token-file",
        metavar="PATH",
        help="read the control token from this file (its first line)",
    )
    p.add_argument(
        "--capture-token",
        default=os.environ.get("ZEPHON_CAPTURE_TOKEN"),
        help="value of the X-Zephon-Capture-Token header every capture and pass-through "
        "route requires (env ZEPHON_CAPTURE_TOKEN; default: the control token)",
    )
    p.add_argument(
        "--capture-token-file",
        metavar="PATH",
        help="read the capture token from this file (its first line)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="listen beyond loopback without --control-token (logged as a warning)",
    )


_MIB = 2**20
_COUNT_LIMITS = [  # option, ProxyConfig field, default, meaning
    ("--max-body-bytes", "max_body_bytes", 16 * _MIB, "largest request body; 413 beyond"),
    (
        "--max-buffered-bytes",
        "max_buffered_bytes",
        256 * _MIB,
        "request body bytes of the requests in flight in one worker; 503 beyond",
    ),
    ("--max-json-depth", "max_json_depth", 128, "deepest JSON of a request body; 400 beyond"),
    (
        "--max-concurrent-requests",
        "max_concurrent_requests",
        1024,
        "capture and pass-through requests in flight per worker; 503 with Retry-After beyond",
    ),
    ("--max-header-bytes", "max_header_bytes", 64 * 2**10, "largest header section; 431 beyond"),
]


def _limits(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ProxyConfig`` fields of the limit options."""
    limits = {field: getattr(args, field) for _, field, _, _ in _COUNT_LIMITS}
    return {**limits, "header_timeout_s": args.header_timeout, "body_timeout_s": args.body_timeout}


def _limit_arguments(p: argparse.ArgumentParser) -> None:
    """What one client may cost a worker (see ProxyConfig)."""
    for option, field, default, meaning in _COUNT_LIMITS:
        p.add_argument(
            option,
            dest=field,
            type=int,
            default=default,
            metavar="N",
            help=f"{meaning} ({default})",
        )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a request's headers may take from its first byte (10)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a request's body may take after its headers (60)",
    )


def _token(value: str | None, path: str | None, option: str) -> str | None:
    """The token from its option (or environment variable) or from its file, not both."""
    if path is None:
        return value or None
    if value:
        raise ValueError(f"give {option} or {option}-file, not both")
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as exc:
        raise ValueError(f"{option}-file {path}: {exc.strerror}") from None
    if not token:
        raise ValueError(f"{option}-file {path} is empty")
    return token


EXIT_STARTUP, EXIT_USAGE = 1, 2


def _error(message: object) -> None:
    """One line on stderr, whatever the exception's text looks like."""
    text = " ".join(str(message).split("\n", 1)[0].split())
    print(f"zephon capture serve: error: {text}", file=sys.stderr, flush=True)


def _probe_store(url: str) -> str | None:
    """Why the store cannot serve (one line), or None: checked before "listening"."""
    from zephon.capture.protocols import RolloutRetiredError
    from zephon.capture.stores import open_store, store_spec

    async def probe() -> None:
        store = open_store(url)
        try:
            await store.has_rows("zephon-proxy-startup-probe")
        except RolloutRetiredError:
            pass
        finally:
            await store.close()

    try:
        asyncio.run(probe())
    except ImportError as exc:
        extra = store_spec(url).extra or "proxy"
        package = (exc.name or str(exc)).split(".")[0]
        return f"store {url.split('?')[0]} needs {package}: pip install 'zephon[{extra}]'"
    except Exception as exc:
        return f"capture store {url.split('?')[0]} is unreachable: {exc}"
    return None


def _serve(args: argparse.Namespace) -> int:
    try:
        for module in ("uvicorn", "starlette", "httpx"):  # the server stack, checked first
            require(module, "the capture proxy")
        from zephon.capture.proxy import ProxyConfig
        from zephon.capture.proxy.server import serve
    except MissingDependencyError as exc:
        _error(str(exc))
        return EXIT_USAGE
    try:
        from zephon.capture.stores import store_class

        store_class(args.store)
        config = ProxyConfig(
            engine_url=args.inference_server[0],
            engine_urls=tuple(args.inference_server),
            connect_retry_s=args.connect_retry,
            store_url=args.store,
            engine_timeout_s=args.inference_timeout,
            connect_timeout_s=args.connect_timeout,
            store_clients=args.store_clients,
            delta_prompts=args.delta_prompts,
            weight_version=args.weight_version,
            control_token=_token(args.control_token, args.control_token_file, "--control-token"),
            capture_token=_token(args.capture_token, args.capture_token_file, "--capture-token"),
            spill_dir=args.spill_dir or None,
            spill_replay_s=args.spill_replay_interval,
            **_limits(args),
        )
    except ValueError as exc:
        _error(exc)
        return EXIT_USAGE
    from zephon.capture.proxy.server import exposure_problem

    exposed = exposure_problem(args.host, config.control_token, insecure=args.insecure_no_auth)
    if exposed is not None and not args.insecure_no_auth:
        _error(exposed)
        return EXIT_USAGE
    problem = _probe_store(args.store)
    if problem is not None:
        _error(problem)
        return EXIT_STARTUP
    try:
        return serve(
            config,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
            access_log=args.access_log,
            insecure_no_auth=args.insecure_no_auth,
        )
    except (ValueError, OSError) as exc:
        _error(exc)
        return EXIT_USAGE
