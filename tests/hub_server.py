"""A Hugging Face hub on loopback, for tests with no internet: the endpoints
huggingface_hub 2.x calls (read from its source: hf_api.model_info, list_repo_tree,
file_download.get_hf_file_metadata and http_get), answered as the hub answers them
(X-Repo-Commit, ETag, X-Error-Code, Range/206), with each request recorded. A repo may be
gated (401 GatedRepo without the right token), and the connection may drop partway
through a file, once, so a test sees the download resume, or pause there until the test
lets it go on, so a test sees a download halfway."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

GOOD_TOKEN = "hf_loopback_test_token"


@dataclass(kw_only=True)
class Repo:
    files: dict[str, bytes]
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    etag: str | None = None  # a hostile hub's ETag for every file, instead of the sha256
    # A hub that redirects each /resolve/ to /stored/<repo>/<file> on the same host, which
    # answers with the file's headers (huggingface_hub follows such redirects).
    redirect: bool = False


@dataclass(kw_only=True)
class Hub:
    repos: dict[str, Repo]
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Range
    drop_after: int | None = None  # bytes of a file sent before the connection drops, once
    pause_after: int | None = None  # bytes of a file sent before waiting for ``go``, once
    paused: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def gets(self, suffix: str) -> list[str]:
        """The Range header of each GET of a path ending in ``suffix`` ('' for none)."""
        return [
            rng for method, path, rng in self.requests if method == "GET" and path.endswith(suffix)
        ]


_INFO = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)(/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_STORED = re.compile(r"/stored/(?P<repo>[^/]+/[^/]+)/(?P<rev>)(?P<file>.+)$")


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range", "")))
            for pattern, route in (
                (_TREE, self._tree),
                (_INFO, self._info),
                (_RESOLVE, self._resolve),
                (_STORED, self._stored),
            ):
                if match := pattern.match(path):
                    repo = hub.repos.get(match["repo"])
                    if repo is None:
                        return self._error(404, "RepoNotFound", "Repository not found")
                    if match["rev"] not in (None, "", "main", repo.sha):
                        return self._error(404, "RevisionNotFound", "Invalid rev id")
                    return route(repo, match, body)
            self._error(404, "", "no such route")

        def _error(self, status: int, code: str, message: str) -> None:
            data = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if hub.pause_after is not None and len(data) > hub.pause_after:
                cut, hub.pause_after = hub.pause_after, None
                self.wfile.write(data[:cut])  # a download caught halfway
                self.wfile.flush()
                hub.paused.set()
                hub.go.wait(timeout=300)
                data = data[cut:]
            self.wfile.write(data)

        def _json(self, value: object, body: bool) -> None:
            data = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _info(self, repo: Repo, match: re.Match[str], body: bool) -> None:
            siblings = [{"rfilename": name, "size": len(data)} for name, data in repo.files.items()]
            self._json(
                {
                    "id": match["repo"],
                    "sha": repo.sha,
                    "private": False,
                    "gated": "manual" if repo.gated else False,
                    "siblings": siblings,
                },
                body,
            )

        def _tree(self, repo: Repo, match: re.Match[str], body: bool) -> None:
            self._json(
                [
                    {
                        "type": "file",
                        "path": name,
                        "size": len(data),
                        "oid": hashlib.sha1(data).hexdigest(),
                    }
                    for name, data in repo.files.items()
                ],
                body,
            )

        def _stored(self, repo: Repo, match: re.Match[str], body: bool) -> None:
            self._resolve(repo, match, body, redirected=True)

        def _resolve(
            self, repo: Repo, match: re.Match[str], body: bool, redirected: bool = False
        ) -> None:
            if repo.redirect and not redirected:
                self.send_response(307)
                self.send_header("Location", f"/stored/{match['repo']}/{match['file']}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if repo.gated and self.headers.get("Authorization") != f"Bearer {GOOD_TOKEN}":
                return self._error(401, "GatedRepo", "Access to this model is restricted")
            data = repo.files.get(match["file"])
            if data is None:
                return self._error(404, "EntryNotFound", "Entry not found")
            start, end = 0, len(data) - 1
            if rng := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")):
                start, end = int(rng[1]), min(int(rng[2] or end), end)
            self.send_response(206 if self.headers.get("Range") else 200)
            self.send_header("X-Repo-Commit", repo.sha)
            self.send_header("ETag", repo.etag or f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start + 1))
            if self.headers.get("Range"):
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.end_headers()
            if body:
                self._send(data[start : end + 1])

        def _send(self, data: bytes) -> None:
            if hub.drop_after is not None and len(data) > hub.drop_after:
                self.wfile.write(data[: hub.drop_after])  # the network fails mid-file
                self.wfile.flush()
                hub.drop_after = None
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if hub.pause_after is not None and len(data) > hub.pause_after:
                cut, hub.pause_after = hub.pause_after, None
                self.wfile.write(data[:cut])  # a download caught halfway
                self.wfile.flush()
                hub.paused.set()
                hub.go.wait(timeout=300)
                data = data[cut:]
            self.wfile.write(data)

    return Handler


@contextmanager
def serve_hub(hub: Hub) -> Iterator[str]:
    """The hub on 127.0.0.1 for the block; yields its endpoint (for HF_ENDPOINT)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
