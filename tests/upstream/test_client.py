"""The one client for a vLLM server, against an in-process stand-in (httpx transport)."""

from __future__ import annotations

import time

import httpx
import pytest

from vllm_offload.upstream.client import VllmClient, wait_until

METRICS = """# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m",engine="0"} 10.0
vllm:prompt_tokens_total{model_name="m",engine="1"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
"""


def stand_in(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/health":
        return httpx.Response(200)
    if request.url.path == "/metrics":
        return httpx.Response(200, text=METRICS)
    if request.url.path == "/v1/models":
        if request.headers.get("authorization") != "Bearer k":
            return httpx.Response(401, json={"error": "no key"})
        return httpx.Response(200, json={"data": [{"id": "m"}]})
    return httpx.Response(404)


def client(api_key: str | None = "k") -> VllmClient:
    return VllmClient("http://vllm:8000/", api_key, transport=httpx.MockTransport(stand_in))


def test_health_models_and_metrics() -> None:
    with client() as server:
        assert server.base_url == "http://vllm:8000"
        assert server.healthy()
        assert server.models() == ["m"]
        wanted = {"vllm:prompt_tokens", "vllm:num_requests_waiting", "vllm:absent"}
        assert server.metrics(wanted) == {
            "vllm:prompt_tokens": 15.0,  # summed over label sets, `_total` dropped
            "vllm:num_requests_waiting": 2.0,
        }
    assert client(api_key=None).models() is None  # refused without the key


def test_nothing_listening() -> None:
    with VllmClient("http://127.0.0.1:1", timeout_s=0.5) as server:
        assert not server.healthy()
        assert server.models() is None


def test_waiting_ends_when_ready_when_the_process_ends_or_at_the_bound() -> None:
    with client() as server:
        server.wait_healthy(60)  # the stand-in is healthy: returns, no TimeoutError
    asked: list[bool] = []
    answers = [False, False, True]
    wait_until(lambda: asked.append(True) or answers[len(asked) - 1], 60, "a thing", poll_s=0.01)
    assert len(asked) == 3  # asked until the answer was yes, and no more
    asked.clear()
    with pytest.raises(RuntimeError, match="the process ended"):
        wait_until(lambda: asked.append(True) or False, 60, "a thing", alive=lambda: False)
    assert asked == []  # a dead process is not asked
    with pytest.raises(TimeoutError, match="waiting for a thing"):
        wait_until(lambda: asked.append(True) or False, 0.05, "a thing", poll_s=0.01)
    assert asked  # asked while the bound lasted
    began = time.monotonic()  # ready while the waiter slept past the bound: still seen
    wait_until(lambda: time.monotonic() - began > 0.2, 0.1, "a thing", poll_s=0.5)


def test_answers_are_read_only_up_to_a_cap() -> None:
    """Found re-reading for #29: whatever listens on the server's port (another user's
    process while the server is down) answers the manager's polls every second, and
    the whole answer was read into memory."""
    from vllm_offload.upstream.client import MAX_CONTROL_BYTES

    def flood(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=iter([b"#" * (1 << 20)] * (MAX_CONTROL_BYTES >> 19)))

    with VllmClient("http://vllm:8000", "k", transport=httpx.MockTransport(flood)) as server:
        with pytest.raises(ValueError, match="over"):
            server.metrics({"vllm:prompt_tokens"})
        assert server.models() is None


def test_an_answer_dripped_a_byte_at_a_time_has_one_deadline() -> None:
    """Issue #55 (the same pattern as the slow-loris): httpx's timeout is per read, so an
    answer dripped a byte every half second was read for as long as it went on."""
    import time

    def drip() -> object:
        while True:
            time.sleep(0.05)
            yield b"#"

    def dripping(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=drip())

    with VllmClient(
        "http://vllm:8000", "k", timeout_s=0.5, transport=httpx.MockTransport(dripping)
    ) as server:
        began = time.monotonic()
        with pytest.raises(httpx.ReadTimeout, match="no whole answer"):
            server.metrics({"vllm:prompt_tokens"})
        assert time.monotonic() - began < 5
        assert server.models() is None
