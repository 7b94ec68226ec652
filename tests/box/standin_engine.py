"""A stand-in for one model's vLLM engine, on a unix socket: /health, /metrics, a streamed
/v1/chat/completions and /v1/completions that name the model, /sleep and /wake_up; it says
our sleep backend runs, as our plugin makes vLLM's processes say (unless --vllm-own-sleep).
Lets the front door's tests run in seconds; the real engines run in tests/e2e/. With
``--record FILE`` it appends every request it gets (method, raw path, query, headers) to
FILE as a JSON line, before anything else reads it."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from vllm_offload.vllm_ext import SLEEP_BACKEND_LINE


def make_app(name: str, record: Path | None = None) -> FastAPI:
    app = FastAPI()
    state = {"asleep": False, "requests": 0}

    @app.middleware("http")
    async def recorded(
        request: Request, call_next: Callable[[Request], Awaitable[object]]
    ) -> object:
        if record is not None:
            seen = {
                "method": request.method,
                "raw_path": request.scope["raw_path"].decode("latin-1"),
                "query": request.scope["query_string"].decode("latin-1"),
                "headers": {
                    k.decode("latin-1"): v.decode("latin-1") for k, v in request.scope["headers"]
                },
            }
            with record.open("a") as f:
                f.write(json.dumps(seen) + "\n")
        return await call_next(request)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return (
            f"# HELP vllm:prompt_tokens prompt tokens\n# TYPE vllm:prompt_tokens counter\n"
            f'vllm:prompt_tokens_total{{model_name="{name}"}} {state["requests"]}.0\n'
        )

    @app.post("/sleep")
    def sleep() -> dict[str, str]:
        state["asleep"] = True
        return {"status": "sleeping"}

    @app.post("/wake_up")
    def wake() -> dict[str, str]:
        state["asleep"] = False
        return {"status": "awake"}

    @app.post("/v1/{path:path}", response_model=None)
    async def answer(path: str, request: Request) -> object:
        body = await request.json()
        if state["asleep"]:
            return PlainTextResponse("asleep", status_code=500)
        state["requests"] += 1
        words = int(body.get("max_tokens", 3))
        if not body.get("stream"):
            return {
                "model": body["model"],
                "served_by": name,
                "path": path,
                "choices": [{"message": {"content": " ".join(["w"] * words)}}],
            }

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(words):
                if state["asleep"]:  # vLLM's sleep (mode=abort) ends what it serves
                    yield b'data: {"error": "aborted by sleep"}\n\n'
                    return
                yield f"data: {json.dumps({'served_by': name, 'i': i})}\n\n".encode()
                await asyncio.sleep(float(body.get("delay_s", 0.0)))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--uds", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--record", type=Path)
    parser.add_argument("--noisy", action="store_true", help="print 1 MB in two lines first")
    parser.add_argument(
        "--stuck-starting",
        action="store_true",
        help="never serve, and ignore SIGTERM (a start that hangs)",
    )
    parser.add_argument(
        "--vllm-own-sleep",
        action="store_true",
        help="do not say our sleep backend runs (as an engine whose vLLM did not load our plugin)",
    )
    args = parser.parse_args()
    if not args.vllm_own_sleep:
        print(SLEEP_BACKEND_LINE, file=sys.stderr, flush=True)
    if args.noisy:  # what an engine's traceback or config dump can look like
        print("x" * 300_000 + "\n" + "y" * 700_000, flush=True)
    if args.stuck_starting:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("stuck starting", flush=True)
        while True:
            time.sleep(60)
    uvicorn.run(make_app(args.name, args.record), uds=args.uds, log_level="warning")
