"""The patched vLLM 0.32 (CPU) server: a max_model_len beyond the KV pool fails fast with
the new message; with auto it is clamped, and an over-long prompt gets HTTP 400 at once
while a short request sent alongside is served."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.server import Server, free_port, server_env
from vllm_offload.upstream.client import VllmClient

pytestmark = pytest.mark.e2e
POOL_BYTES = 4 << 20  # demo model: 2,048 B/token -> 16 blocks of 128 -> 1,920 tokens usable


def test_too_long_max_model_len_fails_fast(demo_dir: Path, tmp_path: Path) -> None:
    kv = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 64 << 20},
    }
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(demo_dir),
        "--port",
        str(free_port()),
        "--max-model-len",
        "8192",
        "--block-size",
        "128",
        "--kv-cache-memory-bytes",
        str(POOL_BYTES),
        "--enforce-eager",
        "--kv-transfer-config",
        json.dumps(kv),
    ]
    began = time.monotonic()
    proc = subprocess.run(
        argv, env=server_env(tmp_path), capture_output=True, text=True, timeout=240
    )
    elapsed = time.monotonic() - began
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "max_model_len 8,192 needs" in log
    assert "The CPU KV tier (0.06 GiB per rank, 32,768 tokens) does not extend one request" in log
    assert "The largest max_model_len that fits is 1,920" in log
    assert elapsed < 180, f"took {elapsed:.0f}s to fail"


def post(url: str, body: dict[str, object]) -> tuple[int, str, float]:
    began = time.monotonic()
    with VllmClient(url) as server:
        response = server.post("/v1/completions", body, timeout_s=60)
    return response.status_code, response.text, time.monotonic() - began


def test_auto_clamps_and_over_long_prompt_gets_400(demo_dir: Path, tmp_path: Path) -> None:
    server = Server(
        [
            "--model",
            str(demo_dir),
            "--model-served-name",
            "demo",
            "--gpu-kv-cache-memory-bytes",
            str(POOL_BYTES),
            "--",
            "--enforce-eager",
        ],
        tmp_path,
    )
    server.start()
    try:
        assert "max_model_len         1,920 tokens (auto" in server.log_path.read_text()
        url = server.base_url
        long_prompt = "hello world " * 2000
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            long = pool.submit(post, url, {"model": "demo", "prompt": long_prompt, "max_tokens": 4})
            short = pool.submit(post, url, {"model": "demo", "prompt": "hello", "max_tokens": 4})
            long_status, long_body, long_s = long.result(timeout=90)
            short_status, short_body, _ = short.result(timeout=90)
        assert long_status == 400, long_body
        assert "1920" in long_body  # the limit is named
        assert long_s < 10
        assert short_status == 200, short_body
        assert json.loads(short_body)["usage"]["completion_tokens"] == 4
    finally:
        server.stop()
