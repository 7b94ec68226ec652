"""Issue #37: what the front door forwards reaches an engine's OpenAI routes only, whatever
the front door's own matching did. ``ForwardedOnly`` runs inside each engine's vLLM server
(vLLM's ``--middleware``, written by the launcher for every engine of several models): a
request bearing the front door's mark is refused anything but ``OPENAI_JSON_ROUTES``; the
runner's own calls (no mark) still reach sleep and wake."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from fastapi import FastAPI

from tests.conftest import make_host
from tests.plan.test_box import LLAMA3_8B, write_shape
from tests.test_argv_check import vllm_reads
from vllm_offload import argv_check
from vllm_offload.box.prepare import prepare_box
from vllm_offload.config import parse
from vllm_offload.hardware import declared
from vllm_offload.vllm_ext.forwarded_routes import FORWARDED_MARK, MIDDLEWARE, ForwardedOnly


def engine_app() -> FastAPI:
    """vLLM's route shapes: an OpenAI route beside development routes."""
    app = FastAPI()
    for path in ("/v1/chat/completions", "/sleep", "/collective_rpc", "/v1/load_lora_adapter"):
        app.add_api_route(path, lambda: {"reached": True}, methods=["POST"])
    app.add_api_route("/is_sleeping", lambda: {"reached": True}, methods=["GET"])
    app.add_middleware(ForwardedOnly)
    return app


async def status(method: str, raw_path: str, marked: bool) -> int:
    headers = {FORWARDED_MARK: "1"} if marked else {}
    transport = httpx.ASGITransport(app=engine_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
        request = client.build_request(method, "http://engine" + raw_path, headers=headers)
        return (await client.send(request)).status_code


def test_a_forwarded_request_reaches_only_the_openai_routes() -> None:
    async def test() -> None:
        assert await status("POST", "/v1/chat/completions", marked=True) == 200
        for method, path in (
            ("POST", "/sleep"),
            ("POST", "/collective_rpc"),
            ("POST", "/v1/load_lora_adapter"),
            ("GET", "/is_sleeping"),
            ("POST", "/v1/chat%2Fcompletions"),
            ("GET", "/v1/chat/completions"),
        ):
            assert await status(method, path, marked=True) == 404, path
            # The runner's own connection carries no mark: its calls go through.
            if "%" not in path and path != "/v1/chat/completions":
                assert await status(method, path, marked=False) == 200, path

    asyncio.run(test())


def test_every_engine_of_several_models_runs_the_guard(tmp_path: Path) -> None:
    data = {
        "models": [
            {"path": str(write_shape(tmp_path / n, LLAMA3_8B)), "served_name": n}
            for n in ("chat", "coder")
        ],
        "residency": {"runtime_dir": str(tmp_path / "run")},
    }
    host = declared(make_host(None), gpu_mem_gib=80, ram_gib=256)
    prepared = prepare_box(parse(data), host, {}, None)
    for spec in prepared.specs.values():
        assert f"--middleware={MIDDLEWARE}" in spec.args
        assert vllm_reads(spec.args)["middleware"] == [MIDDLEWARE]  # as vLLM reads it
        argv_check.check(spec)
