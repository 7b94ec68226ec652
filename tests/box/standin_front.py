"""The real front door (``create_front_app`` under uvicorn, as ``serve`` runs it) on a
loopback port, over two recording stand-in engines: what the front door's attack tests
send raw bytes to. Writes the port to ``DIR/port`` once it listens; each engine records
what reached it in ``DIR/<model>.jsonl``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from vllm_offload.box.engines import EngineProcess, EngineSpec
from vllm_offload.box.front import FrontDoor, create_front_app
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import ResidencySettings
from vllm_offload.box.runner import front_config

STANDIN = str(Path(__file__).with_name("standin_engine.py"))
MODELS = ("chat", "coder")


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to this script (as the runner's does)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(scratch: Path, api_key: str | None) -> None:
    def exited(name: str, _code: int) -> None:
        residency.engine_exited(name)

    def engine(name: str) -> EngineProcess:
        socket = scratch / f"{name}.sock"
        command = (
            sys.executable,
            STANDIN,
            "--uds",
            str(socket),
            "--name",
            name,
            "--record",
            str(scratch / f"{name}.jsonl"),
        )
        return EngineProcess(
            spec=EngineSpec(
                name=name, command=command, env=dict(os.environ), socket=socket, idle="sleep"
            ),
            on_exit=exited,
        )

    engines = {name: engine(name) for name in MODELS}
    residency = Residency(engines, ResidencySettings(min_resident_s=0.2))
    front = FrontDoor(
        engines=engines,
        residency=residency,
        max_model_len=dict.fromkeys(MODELS, 2048),
        api_key=api_key,
    )
    await residency.bring_in("chat")
    residency.start()
    front.ready = True
    server = _Server(front_config(create_front_app(front), "127.0.0.1", 0))
    # SIGTERM ends serve() and then the engines: uvicorn's own handling raises the signal
    # again once it has shut down, which killed this process before its engines stopped.
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGTERM, lambda: setattr(server, "should_exit", True)
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    (scratch / "port").write_text(str(port))
    try:
        await task
    finally:
        await residency.stop()
        await front.aclose()
        for each in engines.values():
            await each.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    asyncio.run(serve(args.dir, args.api_key))
