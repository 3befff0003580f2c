"""The capture proxy's configuration, shippable to worker processes through one env variable.

Worker processes are spawned by the server supervisor and import the app by name, so the
configuration travels as JSON in ``ZEPHON_CAPTURE_PROXY_CONFIG`` rather than as Python objects.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields
from urllib.parse import urlsplit

__all__ = ["CONFIG_ENV", "ProxyConfig"]

CONFIG_ENV = "ZEPHON_CAPTURE_PROXY_CONFIG"


def _engine_root(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"--inference-server {url!r} is not an http(s) URL; pass the inference server's "
            "root, e.g. http://127.0.0.1:8000"
        )
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True)
class ProxyConfig:
    """What one proxy worker needs: where the engine and the store are, and its limits.

    ``engine_url`` is the engine's server root (``http://127.0.0.1:8000``; a trailing ``/v1`` is
    accepted and removed); ``engine_urls``, when given, a fleet of them (``engine_url`` is then
    its first). ``engine_timeout_s`` bounds one whole engine call (generation
    included); ``connect_timeout_s`` only the TCP connect. A refused connection sent nothing,
    so the call is tried again, on the next engine, for up to ``connect_retry_s`` seconds.
    ``control_token``, when set, is the bearer token every control route (health, metrics,
    freeze, manifest, drop, retire, delete) requires; ``capture_token``, when set, the
    ``X-Zephon-Capture-Token`` header every other route (capture and pass-through) requires
    (the rollout workers' secret: the ``Authorization`` header stays the engine's). Given only
    a control token, the capture token is the control token, so one token guards every route.
    ``store_clients`` store clients are opened per worker and each rollout always uses the same
    one (a SQL store client is one connection whose calls queue; several let rollouts proceed in
    parallel, and one client per rollout keeps its lineage cache warm). ``delta_prompts`` stores
    a resolved continuation's prompt as the suffix after its parent's tokens (``prompt_is_delta``),
    which keeps a long rollout's storage linear instead of quadratic. ``weight_version`` is
    recorded on every captured call whose request names none (``X-Zephon-Weight-Version``).
    ``metrics_dir`` is where workers of one server share their metrics (set by ``serve`` when it
    runs several workers). ``spill_dir`` holds the local journal of incomplete marks the store
    could not take (replayed at start and every ``spill_replay_s`` seconds), in a folder per
    store URL; by default under ``$XDG_STATE_HOME/zephon/capture-spill``.

    What one client may cost a worker: a request body of at most ``max_body_bytes`` (413),
    all bodies being read at once at most ``max_buffered_bytes`` (503), JSON nested at most
    ``max_json_depth`` deep (400), at most ``max_concurrent_requests`` capture and
    pass-through requests in flight (503 with ``Retry-After``), request headers of at most
    ``max_header_bytes`` (431) within ``header_timeout_s`` of the first byte, and the body
    within ``body_timeout_s`` of the headers (the connection is closed).
    """

    engine_url: str
    store_url: str
    engine_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    engine_urls: tuple[str, ...] = ()
    connect_retry_s: float = 10.0
    max_engine_connections: int = 1024
    store_clients: int = 4
    delta_prompts: bool = False
    weight_version: int | None = None
    control_token: str | None = None
    capture_token: str | None = None
    metrics_dir: str | None = None
    spill_dir: str | None = None
    spill_replay_s: float = 5.0
    max_body_bytes: int = 16 * 2**20
    max_buffered_bytes: int = 256 * 2**20
    max_json_depth: int = 128
    max_concurrent_requests: int = 1024
    max_header_bytes: int = 64 * 2**10
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        urls = tuple(_engine_root(u) for u in (self.engine_urls or (self.engine_url,)))
        object.__setattr__(self, "engine_urls", urls)
        object.__setattr__(self, "engine_url", urls[0])
        if self.engine_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("engine_timeout_s and connect_timeout_s must be > 0 seconds")
        if self.connect_retry_s < 0:
            raise ValueError("--connect-retry must be >= 0 seconds")
        if self.max_engine_connections < 1:
            raise ValueError("max_engine_connections must be >= 1")
        if self.store_clients < 1:
            raise ValueError("--store-clients must be >= 1")
        self._check_limits()
        if self.control_token and not self.capture_token:
            object.__setattr__(self, "capture_token", self.control_token)
        version = self.weight_version
        if version is not None and (type(version) is not int or not 0 <= version < 2**63):
            raise ValueError(f"--weight-version must be an integer >= 0, not {version!r}")
        if self.spill_replay_s <= 0:
            raise ValueError("--spill-replay-interval must be > 0 seconds")

    def _check_limits(self) -> None:
        counts = {
            "--max-body-bytes": self.max_body_bytes,
            "--max-buffered-bytes": self.max_buffered_bytes,
            "--max-json-depth": self.max_json_depth,
            "--max-concurrent-requests": self.max_concurrent_requests,
            "--max-header-bytes": self.max_header_bytes,
        }
        for option, value in counts.items():
            if type(value) is not int or value < 1:
                raise ValueError(f"{option} must be a positive integer, not {value!r}")
        if self.max_buffered_bytes < self.max_body_bytes:
            raise ValueError("--max-buffered-bytes must be at least --max-body-bytes")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("--header-timeout and --body-timeout must be > 0 seconds")

    @property
    def spill_path(self) -> str:
        """This store's spill journal folder: one per store URL under ``spill_dir`` (or the
        per-user default), so a replay only ever sends marks to the store they were meant for."""
        base = self.spill_dir
        if not base:
            state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
            base = os.path.join(state, "zephon", "capture-spill")
        key = hashlib.sha256(self.store_url.encode()).hexdigest()[:16]
        return os.path.join(base, key)

    def to_env(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ProxyConfig:
        env = os.environ if environ is None else environ
        raw = env.get(CONFIG_ENV)
        if not raw:
            raise RuntimeError(
                f"{CONFIG_ENV} is not set: start workers with `zephon capture serve` or set it "
                "to ProxyConfig(...).to_env()"
            )
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{CONFIG_ENV} has unknown keys {unknown}; known: {sorted(known)}")
        return cls(**data)
