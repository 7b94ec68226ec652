"""Several models on one box (issue #31), end to end on this CPU host: `vllm-offload serve`
with two [[models]] (the demo model under two served names) runs the front door and a
real vLLM CPU engine per model; the official openai client asks them by name. On a CPU a
model that is not on the "GPU" is stopped, so a switch is a stop and a start. The engines
run with vLLM's development routes open (``VLLM_SERVER_DEV_MODE=1``, as the launcher sets it
for engines that sleep on a GPU), so the attacks of issue #37 meet the routes they were
after."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit.server import VLLM_OFFLOAD, server_env
from vllm_offload.bench.server_process import free_port
from vllm_offload.box.control import move, read_models
from vllm_offload.config import DeploymentConfig, parse, save
from vllm_offload.upstream.client import VllmClient, wait_until
from vllm_offload.vllm_ext.forwarded_routes import FORWARDED_MARK

pytestmark = pytest.mark.e2e
START_S = 600  # two engines' starts on a busy 2-core box


@dataclass(kw_only=True)
class Front:
    proc: subprocess.Popen[bytes]
    url: str
    control: Path
    log: Path

    def models(self) -> dict[str, Any]:
        found = read_models(self.control)
        assert isinstance(found, dict), found
        return found


def two_models(tmp_path: Path, port: int) -> DeploymentConfig:
    return parse(
        {
            "extra_args": ["--enforce-eager"],
            "gpu": {"kv_cache_memory_bytes": 128 << 20},  # float32 KV: the demo model (#56)
            "server": {"port": port},
            "models": [{"served_name": "chat"}, {"served_name": "coder", "max_model_len": 2048}],
            "residency": {"runtime_dir": str(tmp_path / "run"), "min_resident_s": 1.0},
        }
    )


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    scratch = tmp_path_factory.mktemp("fleet")
    port = free_port()
    config = scratch / "config.toml"
    save(two_models(scratch, port), config)
    log = scratch / "front.log"
    with log.open("wb") as out:
        env = server_env(scratch) | {"VLLM_SERVER_DEV_MODE": "1"}
        proc = subprocess.Popen(
            [VLLM_OFFLOAD, "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        with VllmClient(url) as server:
            server.wait_healthy(START_S, alive=lambda: proc.poll() is None)
    except (RuntimeError, TimeoutError) as exc:
        proc.kill()
        raise RuntimeError(f"{exc}:\n{log.read_text(errors='replace')[-6000:]}") from None
    yield Front(proc=proc, url=url, control=scratch / "run" / "control.sock", log=log)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=180)


@pytest.fixture
def client(front: Front) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", timeout=START_S)


def states(client: openai.OpenAI) -> dict[str, str]:
    return {m.id: (m.model_extra or {})["state"] for m in client.models.list()}


def test_both_answer_by_name_and_a_stream_survives_the_switch(
    front: Front, client: openai.OpenAI
) -> None:
    assert states(client) == {"chat": "serving", "coder": "stopped"}
    stream = client.completions.create(
        model="chat",
        prompt="count",
        max_tokens=48,
        stream=True,
        temperature=0,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True},
    )
    chunks = iter(stream)
    first = next(chunks)
    other: dict[str, Any] = {}
    asking = threading.Thread(
        target=lambda: other.update(
            answer=client.completions.create(model="coder", prompt="hello", max_tokens=4)
        )
    )
    asking.start()  # asked while chat's stream is running
    rest = list(chunks)
    asking.join(timeout=START_S)
    pieces = [c for c in [first, *rest] if c.choices]
    assert len(pieces) >= 10  # arrived piece by piece, not as one answer
    assert pieces[-1].choices[0].finish_reason == "length"
    usage = [c.usage for c in rest if c.usage is not None]
    assert usage and usage[-1].completion_tokens == 48  # whole: every token of it
    assert all(c.model == "chat" for c in pieces)
    answer = other["answer"]
    assert answer.model == "coder" and answer.usage.completion_tokens == 4
    assert states(client) == {"chat": "stopped", "coder": "serving"}
    texts_of_events = [e["text"] for e in front.models()["events"]]
    assert texts_of_events[-2:] == ["stopped 'chat'", "started 'coder'"]


def test_an_unknown_name_is_404_naming_the_models(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="gpt-4", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert "'gpt-4' does not exist" in str(info.value) and "chat, coder" in str(info.value)


def test_only_openai_routes_are_open(front: Front) -> None:
    for method, path in (
        ("POST", "/sleep"),
        ("POST", "/wake_up"),
        ("GET", "/is_sleeping"),
        ("POST", "/collective_rpc"),
        ("GET", "/docs"),
    ):
        assert httpx.request(method, front.url + path, timeout=10).status_code in (404, 405)


def test_dot_segments_and_encoded_paths_never_reach_an_engine(front: Front) -> None:
    """Through uvicorn, Starlette and httpx, /v1/../X reached the engine's /X (#37)."""
    port = int(front.url.rsplit(":", 1)[1])
    body = b'{"model": "chat", "prompt": "x", "max_tokens": 1}'
    for path in (
        b"/v1/../reset_prefix_cache",
        b"/v1/..%2freset_prefix_cache",
        b"/v1/%2e%2e/collective_rpc",
        b"/v1/load_lora_adapter",
        b"/v1/completions/../../sleep?level=1",
    ):
        request = (
            b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
            conn.sendall(request)
            assert conn.recv(64).split()[1] in (b"404", b"405"), path
    assert front.models()["models"]["chat"]["state"] in ("serving", "stopped")


def test_an_engine_refuses_its_dev_routes_to_what_the_front_door_forwards(front: Front) -> None:
    """Defence in depth: each engine's own ForwardedOnly middleware (vLLM's --middleware)."""
    assert move(front.control, "chat", "bring-in")[0] == 200
    socket_path = front.control.parent / "engines" / "0.sock"  # chat: the first entry
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://engine", timeout=60) as engine:
        marked = {FORWARDED_MARK: "1"}
        assert engine.get("/is_sleeping", headers=marked).status_code == 404
        assert engine.post("/reset_prefix_cache", headers=marked).status_code == 404
        assert engine.get("/is_sleeping").status_code == 200  # the runner's own calls


def test_a_killed_engine_leaves_the_others_serving(front: Front, client: openai.OpenAI) -> None:
    assert move(front.control, "coder", "bring-in")[0] == 200  # whatever ran before (#45)
    pid = front.models()["models"]["coder"]["pid"]
    assert pid is not None and front.models()["models"]["coder"]["state"] == "serving"
    subprocess.run(["kill", "-9", str(pid)], check=True)
    wait_until(lambda: states(client).get("coder") == "failed", 120, "coder's engine to fail")
    answer = client.completions.create(model="chat", prompt="still there?", max_tokens=3)
    assert answer.model == "chat" and front.proc.poll() is None  # the front door stayed up
    again = client.completions.create(model="coder", prompt="back?", max_tokens=3)
    assert again.model == "coder"  # started again when asked for
