"""The real vLLM (CPU) server started through `vllm-offload serve`, asked through the
official openai client, then stopped with no process left behind."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from testkit.server import VLLM_OFFLOAD, Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    scratch = tmp_path_factory.mktemp("serve")
    # The pool size comes from VLLM_CPU_KVCACHE_SPACE, which the planner must honour.
    srv = Server(
        ["--model", str(demo_dir), "--model-served-name", "demo", "--", "--enforce-eager"],
        scratch,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    srv.start()
    yield srv
    if srv.proc is not None and srv.proc.poll() is None:
        srv.stop()


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=60)


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["demo"]


def test_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(model="demo", prompt="hello world", max_tokens=8, temperature=0)
    assert out.usage is not None and out.usage.completion_tokens == 8
    assert isinstance(out.choices[0].text, str) and out.choices[0].text


def test_chat(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hello"}], max_tokens=6
    )
    assert out.choices[0].message.role == "assistant"
    assert out.usage is not None and out.usage.completion_tokens == 6


def test_streamed_chat(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "count"}], max_tokens=10, stream=True
    )
    chunks = [c for c in stream if c.choices and c.choices[0].delta.content]
    assert len(chunks) >= 2  # arrived as a stream, not one blob


def test_plan_predicts_the_logged_pool(server: Server, demo_dir: Path) -> None:
    plan = json.loads(
        subprocess.run(
            [VLLM_OFFLOAD, "plan", "--json", "--model", str(demo_dir)],
            env=server.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    log = server.log_path.read_text()
    logged = re.search(r"KV cache size: ([\d,]+) tokens", log)
    assert logged is not None, log
    tokens = int(logged.group(1).replace(",", ""))
    # 1 GiB / (2 layers x K,V x 4 heads x 64 dims x 2 bytes) = 524,288 tokens
    assert abs(plan["gpu_kv_pool_tokens"] - tokens) <= plan["block_size_tokens"]
    assert plan["gpu_kv_pool_tokens"] == 524_288
    assert "KV pool (host RAM)" in log  # the launcher printed the plan at start (a CPU host)


def test_stop_leaves_no_process(server: Server) -> None:
    leader_children = server.session_processes()
    assert len(leader_children) >= 2  # API server + engine core
    code = server.stop()
    assert code in (0, -15)
    assert server.session_processes() == []
