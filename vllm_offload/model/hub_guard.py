"""What a Hugging Face hub may answer before huggingface_hub writes anything (issue #55).

huggingface_hub 2.4.0 builds paths in the HF cache from the hub's answers unchecked: a
file's ETag names its blob, the commit id (the ``X-Repo-Commit`` header, a model's
``sha``) its snapshot folder and tree-cache file, a listed file name its place in the
snapshot. A hub on HF_ENDPOINT that answered ``ETag: "../../x"`` made `pull` write a file
of its choosing outside HF_HOME. So every answer the library's HTTP client gets passes
``check_answer`` first (a response hook on the client, through
``huggingface_hub.set_client_factory``, the library's own extension point): a commit is 40
hex digits, a file's ETag or content id a git blob id (40) or a sha256 (64), a file name a
relative path of plain parts. Anything else is refused, naming the endpoint, before the
library reads it.

An HF_ENDPOINT that is not https may only be this machine (a mirror on the box, the
tests): over plain http anyone on the path answers as the hub, and HF_TOKEN would cross in
clear. The endpoint as shown never carries the credentials a URL may hold.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any
from urllib.parse import urlsplit

from vllm_offload.model.config_json import ModelFactsError

COMMIT = re.compile(r"[0-9a-f]{40}")
CONTENT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
CONTENT_HEADERS = ("x-linked-etag", "etag", "x-xet-hash")
_CREDENTIALS = re.compile(r"//[^/@\s]*@")


class HubAnswerRefused(ModelFactsError):
    """The hub answered something no hub answers: nothing of it was written."""

    kind = "service"


def shown(text: str) -> str:
    """``text`` (an endpoint, an error naming a URL) without any user:password@ in it."""
    return _CREDENTIALS.sub("//", text)


def check_endpoint(endpoint: str) -> None:
    """Refuse an endpoint that is not https, unless it is this machine."""
    parts = urlsplit(endpoint)
    if parts.scheme == "https":
        return
    host = parts.hostname or ""
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if parts.scheme == "http" and local:
        return
    raise ModelFactsError(
        f"HF_ENDPOINT={shown(endpoint)}: a hub is reached over https (over plain http "
        "anyone on the way answers as the hub, and HF_TOKEN would cross in clear); give an "
        "https:// endpoint, or an http:// one on this machine (127.0.0.1, localhost)"
    )


def _refuse(endpoint: str, what: str, value: object) -> HubAnswerRefused:
    return HubAnswerRefused(
        f"{shown(endpoint)} answered {what} {str(value)[:100]!r}, which is not what a hub "
        "answers (a commit is 40 hex digits, a file's id 40 or 64, a file name a relative "
        "path); refused before anything was written. Check HF_ENDPOINT"
    )


def plain_relative(name: object) -> bool:
    """A file name the snapshot may hold: relative, plain parts, no '..'."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name:
        return False
    parts = name.split("/")
    return all(p not in ("", ".", "..") and p.isprintable() for p in parts)


def check_answer(endpoint: str, url: Any, headers: Any, body: bytes | None) -> None:
    """Raise HubAnswerRefused for an answer that would steer the cache's paths: the JSON of
    an /api/ answer (``body``), the content headers of any other answer from the hub's own
    host (huggingface_hub follows redirects on that host and takes a file's ETag from
    where they end: found in review, a redirect from /resolve/ to another path carried a
    '../..' ETag past a check of /resolve/ paths alone). Another host's answers (a CDN's
    download, whose ETag the library does not use) are not the hub's."""
    commit = headers.get("x-repo-commit")
    if commit is not None and not COMMIT.fullmatch(commit):
        raise _refuse(endpoint, "X-Repo-Commit", commit)
    if body is None and url.host == urlsplit(endpoint).hostname:
        for name in CONTENT_HEADERS:
            value = headers.get(name)
            if value is not None and not CONTENT_ID.fullmatch(value.removeprefix("W/").strip('"')):
                raise _refuse(endpoint, name, value)
    if body is not None:
        try:
            data = json.loads(body)
        except ValueError:
            return  # not JSON: the library refuses it itself
        _check_json(endpoint, data)


def _check_json(endpoint: str, data: object) -> None:
    """A model's info (sha, siblings) or a tree listing (path, oid, lfs.oid, xetHash)."""
    entries = data if isinstance(data, list) else [data]
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        if "sha" in entry and not (
            isinstance(entry["sha"], str) and COMMIT.fullmatch(entry["sha"])
        ):
            raise _refuse(endpoint, "a commit", entry["sha"])
        names = [s.get("rfilename") for s in entry.get("siblings") or [] if isinstance(s, dict)]
        if "path" in entry:
            names.append(entry["path"])
        for name in names:
            if not plain_relative(name):
                raise _refuse(endpoint, "a file name", name)
        lfs = entry["lfs"] if isinstance(entry.get("lfs"), dict) else {}
        for key, value in (
            ("oid", entry.get("oid")),
            ("lfs", lfs.get("oid")),
            ("xetHash", entry.get("xetHash")),
        ):
            if value is not None and not (isinstance(value, str) and CONTENT_ID.fullmatch(value)):
                raise _refuse(endpoint, f"a file's {key}", value)


def is_api(endpoint: str, url: Any) -> bool:
    """Whether ``url`` is the hub's JSON API (under the endpoint's own path: a mirror may
    serve the hub under a prefix, https://host/artifactory/api/huggingfaceml/repo)."""
    prefix = urlsplit(endpoint).path.rstrip("/")
    path = str(url.path)
    return url.host == urlsplit(endpoint).hostname and path.startswith(prefix + "/api/")


def install(endpoint: str) -> None:
    """Check ``endpoint`` and every answer huggingface_hub's clients get from now on."""
    check_endpoint(endpoint)
    import huggingface_hub
    from huggingface_hub.utils._http import default_async_client_factory, default_client_factory

    def hook(response: Any) -> None:
        url = response.request.url
        body = response.read() if is_api(endpoint, url) else None
        check_answer(endpoint, url, response.headers, body)

    async def async_hook(response: Any) -> None:
        url = response.request.url
        body = await response.aread() if is_api(endpoint, url) else None
        check_answer(endpoint, url, response.headers, body)

    def client() -> Any:
        made = default_client_factory()
        hooks = made.event_hooks
        made.event_hooks = {"request": hooks["request"], "response": [*hooks["response"], hook]}
        return made

    def async_client() -> Any:
        made = default_async_client_factory()
        hooks = made.event_hooks
        made.event_hooks = {
            "request": hooks["request"],
            "response": [*hooks["response"], async_hook],
        }
        return made

    huggingface_hub.set_client_factory(client)
    huggingface_hub.set_async_client_factory(async_client)
