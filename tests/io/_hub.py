"""A loopback server speaking the part of the Hugging Face Hub's HTTP API that
``huggingface_hub`` uses to read a dataset: repository info by revision, and file metadata
(HEAD) and content (GET) under ``/datasets/REPO/resolve/REVISION/FILE``."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class Revision:
    commit: str
    files: dict[str, bytes]


@dataclass
class Repo:
    """Named revisions (branches, tags, ``refs/convert/parquet``) of one dataset repository."""

    refs: dict[str, Revision] = field(default_factory=dict)

    def find(self, revision: str) -> Revision | None:
        if revision in self.refs:
            return self.refs[revision]
        return next((r for r in self.refs.values() if r.commit == revision), None)


class Hub:
    """The server; ``repos`` may change while it runs (a branch moving to a new commit)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def info(self, repo_id: str, revision: str) -> tuple[int, dict[str, str], bytes]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return _error(404, "RepoNotFound", f"Repository {repo_id} not found")
        found = repo.find(revision)
        if found is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        body = {
            "id": repo_id,
            "sha": found.commit,
            "private": False,
            "siblings": [{"rfilename": name} for name in sorted(found.files)],
        }
        return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()

    def file(self, repo_id: str, revision: str, name: str) -> tuple[int, dict[str, str], bytes]:
        repo = self.repos.get(repo_id)
        found = repo.find(revision) if repo is not None else None
        if repo is None:
            return _error(404, "RepoNotFound", f"Repository {repo_id} not found")
        if found is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if name not in found.files:
            return _error(404, "EntryNotFound", f"{name} does not exist")
        data = found.files[name]
        headers = {
            "X-Repo-Commit": found.commit,
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Content-Length": str(len(data)),
            "Content-Type": "application/octet-stream",
        }
        return 200, headers, data


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"error": message}).encode()
    return status, {"X-Error-Code": code, "X-Error-Message": message}, body


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _route(self) -> tuple[int, dict[str, str], bytes]:
            path = urlsplit(self.path).path
            hub.requests.append(f"{self.command} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "datasets"] and len(parts) >= 6 and parts[4] == "revision":
                return hub.info(f"{parts[2]}/{parts[3]}", unquote("/".join(parts[5:])))
            if parts[0] == "datasets" and len(parts) >= 6 and parts[3] == "resolve":
                revision = unquote(parts[4])
                return hub.file(f"{parts[1]}/{parts[2]}", revision, "/".join(parts[5:]))
            return _error(404, "NotFound", f"no route {path}")

        def _reply(self, body: bool) -> None:
            status, headers, data = self._route()
            self.send_response(status)
            headers.setdefault("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_GET(self) -> None:
            self._reply(True)

        def do_HEAD(self) -> None:
            self._reply(False)

    return Handler
