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
import time
from collections.abc import Awaitable, Callable, Iterable
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
        os.kill(pid, signal.SIGSTOP)  # locked
        if self.fail == "checkpoint":  # and left so: the driver's failed state
            raise CheckpointError("cuCheckpointProcessCheckpoint answered CUresult 2")

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


def started(process: EngineProcess, body: Callable[[], Awaitable[None]]) -> None:
    """``body`` run with ``process`` started (its output said our sleep backend runs, as
    our plugin makes vLLM's say), the engine stopped after."""

    async def run() -> None:
        await process.start()
        process.ours_sleep = True
        try:
            await body()
        finally:
            await process.stop()

    asyncio.run(run())


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
            time.sleep(0.05)
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

    async def body() -> None:
        assert re.fullmatch(r"slept and checkpointed \(in [\d.]+ s\)", await process.put_away())
        assert process.pid is not None and process_state(process.pid) == "T"
        assert process.checkpointed == (process.pid,)
        how = await asyncio.wait_for(process.bring_in(), 120)  # the wake after the restore
        assert re.fullmatch(r"restored \(in [\d.]+ s\) and woke", how)
        assert process.checkpointed == () and await answers(process)
        assert checkpoints.calls == [("checkpoint", process.pid), ("restore", process.pid)]
        assert asked(tmp_path) == ["/sleep", "/wake_up"]

    started(process, body)


def test_a_failed_checkpoint_kills_the_engine_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Locked, or in the driver's failed state, its shutdown would wait: no SIGTERM grace."""
    monkeypatch.setattr(engines_module, "STOP_GRACE_S", 3600.0)
    process = engine(tmp_path, StoppingCheckpoint(fail="checkpoint"))

    async def body() -> None:
        how = await asyncio.wait_for(process.put_away(), 120)
        assert how.startswith("stopped (its checkpoint failed: cuCheckpointProcess")
        assert process.state == "stopped" and not process.alive

    started(process, body)


def test_a_failed_restore_starts_the_engine_again(tmp_path: Path) -> None:
    process = engine(tmp_path, StoppingCheckpoint(fail="restore"))

    async def body() -> None:
        first = process.pid
        await process.put_away()
        how = await process.bring_in()
        assert how.startswith("started (its restore failed: cuCheckpointProcessRestore")
        assert process.pid != first and process.state == "serving"
        assert await answers(process)

    started(process, body)


def test_a_checkpointed_engine_is_killed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its shutdown would wait on the CUDA calls the driver holds: no SIGTERM grace."""
    monkeypatch.setattr(engines_module, "STOP_GRACE_S", 3600.0)
    process = engine(tmp_path, StoppingCheckpoint())

    async def body() -> None:
        await process.put_away()
        await asyncio.wait_for(process.stop(), 120)
        assert process.state == "stopped" and process.checkpointed == ()

    started(process, body)


def test_without_the_driver_the_checkpoint_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "LIBCUDA", "libcuda-absent.so.1")
    assert not hardware.driver_checkpoints()
    with pytest.raises(CheckpointError, match="process checkpoint: libcuda-absent"):
        DriverCheckpoint()


class FakeLibcuda:
    """libcuda's checkpoint calls as ctypes finds them: each records its name and
    arguments and answers ``results[name]`` (0 by default); a process's state moves as
    the driver's would."""

    def __init__(self, results: dict[str, int] | None = None, stuck: bool = False) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.state = 0  # running
        moves = {
            "cuCheckpointProcessLock": 1,
            "cuCheckpointProcessCheckpoint": 1 if stuck else 2,
            "cuCheckpointProcessRestore": 1,
            "cuCheckpointProcessUnlock": 0,
        }

        def call(name: str) -> object:
            def function(*args: object) -> int:
                self.calls.append((name, args))
                result = (results or {}).get(name, 0)
                if name == "cuCheckpointProcessGetState":
                    args[1]._obj.value = self.state  # type: ignore[attr-defined]
                elif not result and name in moves:
                    self.state = moves[name]
                return result

            return function

        for name in ("cuInit", "cuCheckpointProcessGetState", *moves):
            setattr(self, name, call(name))


def driver_over(monkeypatch: pytest.MonkeyPatch, lib: FakeLibcuda) -> DriverCheckpoint:
    import ctypes

    monkeypatch.setattr(ctypes, "CDLL", lambda _name: lib)
    return DriverCheckpoint()


def test_the_driver_is_called_as_cuda_h_says(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    from vllm_offload.box.process_checkpoint import LOCK_TIMEOUT_MS, _LockArgs

    lib = FakeLibcuda()
    driver = driver_over(monkeypatch, lib)
    driver.checkpoint(4242)
    driver.restore(4242)
    names = [name for name, _ in lib.calls if name != "cuCheckpointProcessGetState"]
    assert names == [
        "cuInit",
        "cuCheckpointProcessLock",
        "cuCheckpointProcessCheckpoint",
        "cuCheckpointProcessRestore",
        "cuCheckpointProcessUnlock",
    ]
    lock = next(args for name, args in lib.calls if name == "cuCheckpointProcessLock")
    assert lock[0] == 4242 and ctypes.sizeof(_LockArgs) == 64  # CUcheckpointLockArgs
    assert lock[1]._obj.timeoutMs == LOCK_TIMEOUT_MS  # type: ignore[attr-defined]
    assert lib.state == 0  # running again


def test_a_process_the_driver_left_on_the_gpu_is_a_failed_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lib = FakeLibcuda(stuck=True)
    with pytest.raises(CheckpointError, match="process 7 is locked, not checkpointed"):
        driver_over(monkeypatch, lib).checkpoint(7)
    assert lib.calls[-1][0] == "cuCheckpointProcessUnlock" and lib.state == 0


def test_the_checkpoints_error_is_said_when_the_unlock_fails_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lib = FakeLibcuda({"cuCheckpointProcessCheckpoint": 2, "cuCheckpointProcessUnlock": 999})
    with pytest.raises(CheckpointError, match="cuCheckpointProcessCheckpoint answered CUresult 2"):
        driver_over(monkeypatch, lib).checkpoint(7)
