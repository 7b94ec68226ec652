"""What the several-models benches (switch.py, turns.py) share: a `vllm-offload serve`
config with [[models]] of one checkpoint ("a", the default, "b", ...), the server
started in its own session and stopped with its process group, token-id prompts, a streamed
request's first token, and the front door's control socket (models' states and events)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from vllm_offload.bench.client import fixed_length_body

PROMPT_IDS = [100, 30000]  # token ids drawn from here (--vocab-high: a smaller model's)


def box_config(
    *,
    checkpoint: Path,
    port: int,
    run_dir: Path,
    pool_bytes: int,
    tier_gib: float,
    vllm_args: list[str],
    residency: Mapping[str, str | int | float],
    names: tuple[str, ...] = ("a", "b"),
) -> str:
    """The TOML: token ids in and out (--skip-tokenizer-init), fixed GPU pools and CPU
    tiers, one model per name (the first the default), ``residency`` as given (values as
    TOML writes them), the control socket under ``run_dir``."""
    model = f'path = "{checkpoint}"\n'
    extra = json.dumps(["--skip-tokenizer-init", *vllm_args])
    settings = "".join(f"{key} = {json.dumps(value)}\n" for key, value in residency.items())
    return (
        f"extra_args = {extra}\n[gpu]\n"
        f"kv_cache_memory_bytes = {pool_bytes}\n"
        f"[kv_offload]\ncpu_tier_gib = {tier_gib}\n[server]\nport = {port}\n"
        + "".join(f'[[models]]\n{model}served_name = "{name}"\n' for name in names)
        + f'[residency]\n{settings}runtime_dir = "{run_dir}"\n'
    )


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(*PROMPT_IDS) for _ in range(n)]


async def first_token(
    client: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int = 8
) -> tuple[float, int]:
    """(seconds to the first streamed token, chunks received: each carries one token or
    more, so the count is a floor on the tokens)."""
    body = fixed_length_body(prompt, max_tokens, model)
    began = time.perf_counter()
    ttft, got = None, 0
    async with client.stream("POST", "/v1/completions", json=body, timeout=600) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if line.startswith("data: {"):
                ttft = ttft or time.perf_counter() - began
                got += 1
    assert ttft is not None, "no token came"
    return ttft, got


def control(run_dir: Path) -> dict[str, Any]:
    """The front door's /models: each model's state and the events (switch steps)."""
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=str(run_dir / "control.sock")),
        base_url="http://front",
        timeout=30,
    ) as c:
        data: dict[str, Any] = c.get("/models").json()
        return data


def plan(
    config: Path, *flags: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`vllm-offload plan --config CONFIG FLAGS...`, its output captured (it may refuse)."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_offload", "plan", "--config", str(config), *flags],
        capture_output=True,
        text=True,
        env=dict(env if env is not None else os.environ),
        check=False,
    )


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def serving(
    config: Path, log: Path, port: int, start_timeout: float, env: Mapping[str, str] | None = None
) -> Iterator[float]:
    """`vllm-offload serve --config CONFIG` in its own session, its output in ``log``:
    yields the seconds until /health answered 200 (every model started, the default
    serving); at the end SIGTERM to its process group, SIGKILL after 120 s."""
    began = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_offload", "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env if env is not None else os.environ),
            start_new_session=True,
        )
    try:
        while not healthy(port):
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited {proc.returncode}")
            if time.monotonic() - began > start_timeout:
                raise TimeoutError(f"not healthy in {start_timeout} s")
            time.sleep(0.5)
        yield round(time.monotonic() - began, 2)
    finally:
        with contextlib.suppress(ProcessLookupError):  # its group may be gone already
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
