"""The front door (issue #31) over engine processes: real child processes on unix sockets
(tests/box/standin_engine.py stands in for vLLM, which tests/e2e/test_fleet_e2e.py
runs), the switcher, and the app driven through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import uvicorn

from vllm_offload.box.engines import STARTING_GRACE_S, EngineProcess, EngineSpec
from vllm_offload.box.front import FrontDoor, create_front_app
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import ResidencySettings
from vllm_offload.upstream.client import sum_samples

STANDIN = str(Path(__file__).with_name("standin_engine.py"))


Front = tuple[httpx.AsyncClient, FrontDoor]


def standin(tmp_path: Path, name: str, exited: Callable[[str, int], None]) -> EngineProcess:
    socket = tmp_path / f"{name}.sock"
    command = (sys.executable, STANDIN, "--uds", str(socket), "--name", name)
    return EngineProcess(
        spec=EngineSpec(
            name=name, command=command, env=dict(os.environ), socket=socket, idle="sleep"
        ),
        on_exit=exited,
    )


@asynccontextmanager
async def front_door(tmp_path: Path, api_key: str | None = None) -> AsyncIterator[Front]:
    residency_ref: list[Residency] = []

    def exited(name: str, _code: int) -> None:
        residency_ref[0].engine_exited(name)

    engines = {name: standin(tmp_path, name, exited) for name in ("chat", "coder")}
    residency = Residency(engines, ResidencySettings(min_resident_s=0.2))
    residency_ref.append(residency)
    front = FrontDoor(
        engines=engines,
        residency=residency,
        max_model_len={"chat": 2048, "coder": 4096},
        api_key=api_key,
    )
    await residency.bring_in("chat")
    residency.start()
    # Real HTTP under uvicorn, as serve runs it: httpx's ASGI transport hands a streamed
    # answer over only once it is whole, so a stream cut by a switch looked whole.
    server = uvicorn.Server(
        uvicorn.Config(create_front_app(front), host="127.0.0.1", port=0, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client, front
    finally:
        server.should_exit = True
        await serving
        await residency.stop()
        await front.aclose()
        for engine in engines.values():
            await engine.stop()


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 180))


def chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def test_requests_go_to_their_model_and_a_switch_happens(tmp_path: Path) -> None:
    async def test() -> None:
        async with front_door(tmp_path) as (client, _front):
            first = await client.post("/v1/chat/completions", json=chat("chat"))
            assert first.json()["served_by"] == "chat"
            other = await client.post("/v1/completions", json={"model": "coder", "prompt": "x"})
            assert other.status_code == 200 and other.json()["served_by"] == "coder"
            assert other.json()["path"] == "completions"
            listed = (await client.get("/v1/models")).json()["data"]
            states = {m["id"]: (m["state"], m["max_model_len"]) for m in listed}
            assert states == {"chat": ("asleep", 2048), "coder": ("serving", 4096)}
            waits = {m["id"]: m["expected_wait_s"] for m in listed}
            # coder serves; chat waits for coder's turn and a switch (as chat's took)
            assert waits["coder"] == 0.0 and 0 < waits["chat"] <= 0.2 + 60

    run(test)


def test_a_stream_survives_a_switch_asked_beside_it(tmp_path: Path) -> None:
    async def test() -> None:
        async with front_door(tmp_path) as (client, front):
            chunks: list[dict[str, object]] = []

            async def stream() -> None:
                body = chat("chat", stream=True, max_tokens=20, delay_s=0.05)
                async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
                    async for line in answer.aiter_lines():
                        if line.startswith("data: {"):
                            chunks.append(json.loads(line[6:]))

            streaming = asyncio.create_task(stream())
            while not chunks:
                await asyncio.sleep(0.01)
            other = await client.post("/v1/chat/completions", json=chat("coder"))
            await streaming
            assert [c["i"] for c in chunks] == list(range(20))  # whole, in order
            assert all(c["served_by"] == "chat" for c in chunks)
            assert other.json()["served_by"] == "coder"
            assert front.residency.slots["coder"].status == "serving"

    run(test)


def test_an_unknown_model_is_404_naming_the_registered_ones(tmp_path: Path) -> None:
    async def test() -> None:
        async with front_door(tmp_path) as (client, _front):
            answer = await client.post("/v1/chat/completions", json=chat("gpt-4"))
            assert answer.status_code == 404
            message = answer.json()["error"]["message"]
            assert "'gpt-4' does not exist" in message and "chat, coder" in message
            not_an_object = await client.post(
                "/v1/chat/completions", content=b"[1]", headers={"Content-Type": "application/json"}
            )
            assert not_an_object.status_code == 400
            assert (await client.get("/docs")).status_code == 404  # only OpenAI routes
            assert (await client.post("/sleep")).status_code == 404  # never an engine's own

    run(test)


def test_a_killed_engine_leaves_the_others_serving_and_starts_again(tmp_path: Path) -> None:
    async def test() -> None:
        async with front_door(tmp_path) as (client, front):
            await client.post("/v1/chat/completions", json=chat("coder"))
            coder = front.engines["coder"]
            assert coder.pid is not None
            os.kill(coder.pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while front.residency.slots["coder"].status != "failed":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert front.state_of("coder") == "failed"
            answer = await client.post("/v1/chat/completions", json=chat("chat"))
            assert answer.json()["served_by"] == "chat"  # the other model serves
            again = await client.post("/v1/chat/completions", json=chat("coder"))
            assert again.json()["served_by"] == "coder"  # and the killed one is back

    run(test)


def test_the_api_key_and_the_merged_metrics(tmp_path: Path) -> None:
    async def test() -> None:
        async with front_door(tmp_path, api_key="s3cret") as (client, _front):
            assert (await client.post("/v1/chat/completions", json=chat("chat"))).status_code == 401
            assert (await client.get("/v1/models")).status_code == 401
            key = {"Authorization": "Bearer s3cret"}
            await client.post("/v1/chat/completions", json=chat("chat"), headers=key)
            await client.post("/v1/chat/completions", json=chat("coder"), headers=key)
            text = (await client.get("/metrics")).text  # no key: as vLLM's own /metrics
            assert text.count("# TYPE vllm:prompt_tokens counter") == 1
            assert 'model_name="chat"' in text and 'model_name="coder"' in text
            assert sum_samples(text, {"vllm:prompt_tokens"}) == {"vllm:prompt_tokens": 2.0}

    run(test)


def test_an_engine_s_long_lines_do_not_stop_its_output(tmp_path: Path) -> None:
    """A line past asyncio's 64 KiB limit ended the output pump (#37's re-read of the
    runner); the engine then blocked on a full pipe and never became healthy."""

    async def test() -> None:
        socket = tmp_path / "noisy.sock"
        command = (sys.executable, STANDIN, "--uds", str(socket), "--name", "noisy", "--noisy")
        spec = EngineSpec(
            name="noisy", command=command, env=dict(os.environ), socket=socket, idle="stop"
        )
        engine = EngineProcess(spec=spec, on_exit=lambda _name, _code: None)
        try:
            await asyncio.wait_for(engine.start(), 120)
            assert engine.state == "serving"
            assert {len(line) for line in engine.tail} >= {8192}  # cut, kept
        finally:
            await engine.stop()

    run(test)


def test_an_engine_stuck_starting_is_stopped_within_its_grace(tmp_path: Path) -> None:
    """An engine whose start hangs and which ignores SIGTERM (as vLLM's could, issue #43)
    is killed with its process group after engines.STARTING_GRACE_S (the runner's stop
    bound counts on it), not after minutes."""

    async def test() -> None:
        engine = standin(tmp_path, "chat", lambda _name, _code: None)
        engine.spec = replace(engine.spec, command=(*engine.spec.command, "--stuck-starting"))
        starting = asyncio.create_task(engine.start())
        deadline = time.monotonic() + 60
        while "stuck starting" not in engine.tail:  # its SIGTERM is ignored from here
            assert time.monotonic() < deadline, "the stand-in did not start"
            await asyncio.sleep(0.05)
        starting.cancel()
        began = time.monotonic()
        await asyncio.wait_for(engine.stop(), STARTING_GRACE_S + 30)
        assert not engine.alive and engine.state == "stopped"
        assert time.monotonic() - began >= STARTING_GRACE_S - 1  # SIGTERM was ignored

    run(test)


def test_an_engine_that_never_said_our_sleep_backend_runs_is_stopped_not_slept(
    tmp_path: Path,
) -> None:
    """Issue #43: an engine whose vLLM did not load our plugin would sleep with vLLM's own
    backend and keep more host RAM than planned: the front door stops it instead."""

    async def test() -> None:
        ours, theirs = (
            standin(tmp_path, "chat", lambda *_: None),
            standin(tmp_path, "coder", lambda *_: None),
        )
        theirs.spec = replace(theirs.spec, command=(*theirs.spec.command, "--vllm-own-sleep"))
        for engine in (ours, theirs):
            await engine.start()
        try:
            deadline = time.monotonic() + 60
            while not ours.ours_sleep:  # its line may come just after it serves
                assert time.monotonic() < deadline, "the stand-in never said it"
                await asyncio.sleep(0.05)
            assert await ours.put_away() == "slept" and ours.alive
            assert (await theirs.put_away()).startswith("stopped (its output never said")
            assert not theirs.alive and theirs.state == "stopped"
        finally:
            for engine in (ours, theirs):
                await engine.stop()

    run(test)
