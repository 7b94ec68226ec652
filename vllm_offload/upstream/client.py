"""One small client for a vLLM OpenAI server: health, models, metrics, one request, and
waiting until it is healthy. The manager, the bench, the benchmark scripts and the
end-to-end tests all talk to vLLM through it (one HTTP stack: httpx)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# How long one control call (health, models, metrics) may take: a server that does not
# answer that fast is busy or gone.
CONTROL_TIMEOUT_S = 2.0
# The most of a /metrics or /v1/models answer that is read: whatever listens on the port
# (another local user's process, while the server is down) answers the manager's polls.
MAX_CONTROL_BYTES = 16 * 1024 * 1024
# A connection per request to vLLM's server: uvicorn closes an idle connection at its
# keep-alive deadline without asking whether a request came, so a server held up between
# its poll and its timers (a box whose CPU is taken) resets a request sent on a kept
# connection; a fresh one is never closed under a request (loopback or a unix socket:
# microseconds). Our own servers ask first (http_limits). httpx's cap of 100 connections
# at once stays (the front door's 101st request to one engine waits for a connection).
FRESH_CONNECTIONS = httpx.Limits(max_connections=100, max_keepalive_connections=0)


def sum_samples(text: str, wanted: Collection[str]) -> dict[str, float]:
    """{sample name (less `_total`): sum over all label sets} of a Prometheus text, for the
    ``wanted`` names."""
    return totals(sum_samples_by_model(text, wanted).values())


def sum_samples_by_model(text: str, wanted: Collection[str]) -> dict[str, dict[str, float]]:
    """sum_samples for each vLLM ``model_name`` label (the served name; "" for samples
    without one): the front door's merged /metrics, one group per engine."""
    groups: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in wanted:
                values = groups.setdefault(sample.labels.get("model_name", ""), {})
                values[name] = values.get(name, 0.0) + float(sample.value)
    return groups


def totals(groups: Iterable[dict[str, float]]) -> dict[str, float]:
    """The groups' values summed by name."""
    summed: dict[str, float] = {}
    for group in groups:
        for name, value in group.items():
            summed[name] = summed.get(name, 0.0) + value
    return summed


def wait_until(
    ready: Callable[[], bool],
    timeout_s: float,
    what: str,
    alive: Callable[[], bool] = lambda: True,
    poll_s: float = 0.5,
) -> float:
    """Seconds until ``ready()``: the one waiting loop. Raises RuntimeError as soon as
    ``alive()`` is false (say, the server process ended) and TimeoutError after
    ``timeout_s``; ``what`` names the wait in both. ``ready()`` is asked once more after
    the bound passed: a host that stood this process still past it (CI's box did for
    ~20 s) gave the thing waited for no chance to be seen."""
    began = time.monotonic()
    while True:
        if not alive():
            raise RuntimeError(f"gave up waiting for {what}: the process ended")
        if ready():
            return time.monotonic() - began
        if time.monotonic() - began >= timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


class VllmClient:
    """A vLLM server at ``base_url`` (``http://host:port``); ``api_key`` for the routes
    vLLM guards with it (``/v1/...``). ``transport`` serves in-process tests."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = CONTROL_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            limits=FRESH_CONNECTIONS,  # (httpx ignores it beside a transport: tests only)
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> VllmClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def healthy(self) -> bool:
        """Whether /health answers 200 now."""
        try:
            return self.http.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _get_capped(self, path: str, timeout_s: float | None = None) -> bytes:
        """GET ``path``'s body, at most MAX_CONTROL_BYTES of it (ValueError past that) and
        within one deadline for the whole body (httpx's timeout is per read: an answer
        dripped a byte at a time never trips it; issue #55); raises httpx.HTTPError."""
        timeout = timeout_s or self.http.timeout.read or CONTROL_TIMEOUT_S
        deadline = time.monotonic() + 2 * timeout
        with self.http.stream("GET", path, timeout=timeout) as response:
            response.raise_for_status()
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_CONTROL_BYTES:
                    raise ValueError(f"{path}: an answer over {MAX_CONTROL_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"{path}: no whole answer within {2 * timeout:.1f} s")
        return bytes(body)

    def models(self) -> list[str] | None:
        """The served model names, or None where nothing (or no vLLM) answers."""
        try:
            return [str(m["id"]) for m in json.loads(self._get_capped("/v1/models"))["data"]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def metrics(self, wanted: Collection[str], timeout_s: float | None = None) -> dict[str, float]:
        """vLLM's /metrics, summed by name over label sets; raises httpx.HTTPError, or
        ValueError for an answer that is too large or not Prometheus text."""
        text = self._get_capped("/metrics", timeout_s).decode(errors="replace")
        return sum_samples(text, wanted)

    def metrics_by_model(
        self, wanted: Collection[str], timeout_s: float | None = None
    ) -> dict[str, dict[str, float]]:
        """vLLM's /metrics, summed by name for each served model (sum_samples_by_model);
        raises as ``metrics``."""
        text = self._get_capped("/metrics", timeout_s).decode(errors="replace")
        return sum_samples_by_model(text, wanted)

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 300) -> httpx.Response:
        """One request (a completion, a chat turn); the response whatever its status."""
        return self.http.post(path, json=body, timeout=timeout_s)

    def wait_healthy(
        self, timeout_s: float, alive: Callable[[], bool] = lambda: True, poll_s: float = 0.5
    ) -> float:
        """Seconds until /health answers 200; see ``wait_until``."""
        return wait_until(self.healthy, timeout_s, f"{self.base_url}/health", alive, poll_s)
