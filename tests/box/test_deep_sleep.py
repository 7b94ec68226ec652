"""Deep sleep on this CPU host: the engine's processes found by their session, and an engine
(the stand-in, a real process) checkpointed after its sleep and restored before its wake.
The driver is absent here: its stand-in stops the processes it "checkpoints" (SIGSTOP), so
an engine asked anything before its restore would not answer, as a checkpointed one's CUDA
calls would wait; the driver itself is proven on the GPU host
(benchmarks/gpu/checkpoint_floor.py, benchmarks/gpu/switch.py --deep-sleep)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest

from tests.box.standin_front import STANDIN
from vllm_offload import hardware
from vllm_offload.box import engines as engines_module
from vllm_offload.box.engines import EngineProcess, EngineSpec, uds_client
from vllm_offload.box.process_checkpoint import (
    CheckpointError,
    DriverCheckpoint,
    session_processes,
)


class StoppingCheckpoint:
    """The driver's calls, standing in: a checkpointed process is stopped until restored;
    ``fail`` names a call that raises."""

    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.calls: list[tuple[str, int]] = []

    def cuda_processes(self, pids: Iterable[int]) -> list[int]:
        return list(pids)

    def checkpoint(self, pid: int) -> None:
        self.calls.append(("checkpoint", pid))
        if self.fail == "checkpoint":
            raise CheckpointError("cuCheckpointProcessCheckpoint answered CUresult 2")
        os.kill(pid, signal.SIGSTOP)

    def restore(self, pid: int) -> None:
        self.calls.append(("restore", pid))
        if self.fail == "restore":
            raise CheckpointError("cuCheckpointProcessRestore answered CUresult 2")
        os.kill(pid, signal.SIGCONT)


def process_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def engine(tmp_path: Path, checkpoints: StoppingCheckpoint) -> EngineProcess:
    socket = tmp_path / "chat.sock"
    command = (sys.executable, STANDIN, "--uds", str(socket), "--name", "chat")
    command += ("--record", str(tmp_path / "chat.jsonl"))
    spec = EngineSpec(
        name="chat", command=command, env=dict(os.environ), socket=socket, idle="sleep"
    )
    return EngineProcess(spec=spec, on_exit=lambda *_: None, checkpoints=checkpoints)


def asked(tmp_path: Path) -> list[str]:
    lines = (tmp_path / "chat.jsonl").read_text().splitlines()
    return [json.loads(line)["raw_path"] for line in lines if "/health" not in line]


async def answers(process: EngineProcess) -> bool:
    async with uds_client(process.spec.socket, 30.0) as client:
        try:
            return (await client.get("/health")).status_code == 200
        except httpx.HTTPError:
            return False


def test_session_processes_are_the_leader_and_its_children() -> None:
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        for _ in range(200):  # its two children forked
            found = session_processes(leader.pid)
            if len(found) == 3:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert leader.pid in found and len(found) == 3
        assert os.getpid() not in found
        assert session_processes(os.getsid(0)) != found
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_an_engine_is_checkpointed_after_its_sleep_and_restored_before_its_wake(
    tmp_path: Path,
) -> None:
    checkpoints = StoppingCheckpoint()
    process = engine(tmp_path, checkpoints)

    async def run() -> None:
        await process.start()
        process.ours_sleep = True
        try:
            assert re.fullmatch(r"slept and checkpointed \(in [\d.]+ s\)", await process.put_away())
            assert process.pid is not None and process_state(process.pid) == "T"
            assert process.checkpointed == (process.pid,)
            assert re.fullmatch(r"restored \(in [\d.]+ s\) and woke", await process.bring_in())
            assert process.checkpointed == () and await answers(process)
            assert checkpoints.calls == [("checkpoint", process.pid), ("restore", process.pid)]
            assert asked(tmp_path) == ["/sleep", "/wake_up"]
        finally:
            await process.stop()

    asyncio.run(run())


def test_a_failed_checkpoint_stops_the_engine(tmp_path: Path) -> None:
    process = engine(tmp_path, StoppingCheckpoint(fail="checkpoint"))

    async def run() -> None:
        await process.start()
        process.ours_sleep = True
        try:
            how = await process.put_away()
            assert how.startswith("stopped (its checkpoint failed: cuCheckpointProcess")
            assert process.state == "stopped" and not process.alive
        finally:
            await process.stop()

    asyncio.run(run())


def test_a_failed_restore_starts_the_engine_again(tmp_path: Path) -> None:
    process = engine(tmp_path, StoppingCheckpoint(fail="restore"))

    async def run() -> None:
        await process.start()
        process.ours_sleep = True
        first = process.pid
        try:
            await process.put_away()
            how = await process.bring_in()
            assert how.startswith("started (its restore failed: cuCheckpointProcessRestore")
            assert process.pid != first and process.state == "serving"
            assert await answers(process)
        finally:
            await process.stop()

    asyncio.run(run())


def test_a_checkpointed_engine_is_killed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its shutdown would wait on the CUDA calls the driver holds: no SIGTERM grace."""
    monkeypatch.setattr(engines_module, "STOP_GRACE_S", 3600.0)
    process = engine(tmp_path, StoppingCheckpoint())

    async def run() -> None:
        await process.start()
        process.ours_sleep = True
        await process.put_away()
        await asyncio.wait_for(process.stop(), 120)
        assert process.state == "stopped" and process.checkpointed == ()

    asyncio.run(run())


def test_without_the_driver_the_checkpoint_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "LIBCUDA", "libcuda-absent.so.1")
    assert not hardware.driver_checkpoints()
    with pytest.raises(CheckpointError, match="process checkpoint: libcuda-absent"):
        DriverCheckpoint()
