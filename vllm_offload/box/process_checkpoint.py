"""Deep sleep (``residency.deep_sleep``): what a sleeping engine still holds on the GPU moved
to host RAM by the NVIDIA driver's process checkpoint, called from the front door.

vLLM's sleep gives back the weights and the KV pool, but the engine's CUDA context, cuBLAS
and its CUDA graphs' pools stay: 1.53-2.41 GiB for an 8B engine on an H200, of which no
release inside the process gives back more than a little (torch alone keeps 1.15 GiB on an
H100 after its graphs are deleted; docs/several-models.md). The driver's
``cuCheckpointProcessLock / Checkpoint / Restore / Unlock`` (libcuda, NVIDIA driver 570 or
newer, Linux) act on another process: the lock waits for its GPU work to end and holds its
CUDA calls, the checkpoint copies its device memory to host RAM and releases all of it,
context included, and the restore brings it back to the same addresses (measured on an
H100 with torch's graphs: 0 GiB while checkpointed, a graph replayed to the same bytes
after each restore; restore ~0.15 s a GiB + 0.13 s; ``benchmarks/gpu/checkpoint_floor.py``).

The engine's processes are those of its session (the front door starts each engine in a
session of its own); those that hold a CUDA context are the ones the driver reports a
state for.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from vllm_offload import hardware

# CUprocessState (cuda.h)
STATES = ("running", "locked", "checkpointed", "failed")
# The lock waits this long for the engine's GPU work to end (an engine asleep has none).
LOCK_TIMEOUT_MS = 30_000


class CheckpointError(Exception):
    """A checkpoint or restore did not happen; the text says which call and why."""


class ProcessCheckpoint(Protocol):
    """The driver's calls as an engine uses them (``box.engines``); blocking."""

    def cuda_processes(self, pids: Iterable[int]) -> list[int]:
        """Those of ``pids`` that hold a CUDA context."""
        ...

    def checkpoint(self, pid: int) -> None:
        """Lock ``pid`` and move its device memory to host RAM."""
        ...

    def restore(self, pid: int) -> None:
        """Bring its device memory back and unlock it."""
        ...


class _LockArgs(ctypes.Structure):
    # CUcheckpointLockArgs (cuda.h, 12.8+): the rest is reserved and must be zero
    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class DriverCheckpoint:
    """libcuda's process checkpoint. This process makes no CUDA context (``cuInit`` only,
    which the calls need)."""

    def __init__(self) -> None:
        try:
            self._cuda = ctypes.CDLL(hardware.LIBCUDA)
            getattr(self._cuda, hardware.CHECKPOINT_CALL)
            self._call("cuInit", 0)
        except (OSError, AttributeError, CheckpointError) as exc:
            raise CheckpointError(f"the NVIDIA driver's process checkpoint: {exc}") from None

    def _call(self, name: str, *args: object) -> None:
        function = getattr(self._cuda, name)
        function.restype = ctypes.c_int
        result = function(*args)
        if result != 0:
            raise CheckpointError(f"{name} answered CUresult {result}")

    def state(self, pid: int) -> str:
        state = ctypes.c_int(-1)
        self._call("cuCheckpointProcessGetState", pid, ctypes.byref(state))
        return STATES[state.value] if 0 <= state.value < len(STATES) else str(state.value)

    def cuda_processes(self, pids: Iterable[int]) -> list[int]:
        held = []
        for pid in pids:
            try:
                self.state(pid)
            except CheckpointError:  # no CUDA context: nothing of it to move
                continue
            held.append(pid)
        return held

    def checkpoint(self, pid: int) -> None:
        """Lock and checkpoint ``pid``; raises unless the driver then says it is
        checkpointed (a process it left on the GPU would hold what the plan gave none)."""
        self._expect(pid, "running")
        self._call("cuCheckpointProcessLock", pid, ctypes.byref(_LockArgs(LOCK_TIMEOUT_MS)))
        try:
            self._call("cuCheckpointProcessCheckpoint", pid, None)
            self._expect(pid, "checkpointed")
        except CheckpointError:
            with contextlib.suppress(CheckpointError):  # the first error is the one to say
                self._call("cuCheckpointProcessUnlock", pid, None)
            raise

    def restore(self, pid: int) -> None:
        self._call("cuCheckpointProcessRestore", pid, None)
        self._call("cuCheckpointProcessUnlock", pid, None)
        self._expect(pid, "running")

    def _expect(self, pid: int, state: str) -> None:
        if (found := self.state(pid)) != state:
            raise CheckpointError(f"process {pid} is {found}, not {state}")


def session_processes(session: int, proc: Path = Path("/proc")) -> list[int]:
    """The live processes of ``session`` (the leader's pid), read from /proc."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 3 and fields[3] == str(session) and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def checkpoint_all(driver: ProcessCheckpoint, session: int) -> tuple[int, ...]:
    """Every process of the engine's session that holds a CUDA context, checkpointed; the
    ones done are restored again where one fails."""
    pids = driver.cuda_processes(session_processes(session))
    if not pids:
        raise CheckpointError(f"no process of session {session} holds a CUDA context")
    done: list[int] = []
    try:
        for pid in pids:
            driver.checkpoint(pid)
            done.append(pid)
    except CheckpointError:
        restore_all(driver, tuple(done))
        raise
    return tuple(done)


def restore_all(driver: ProcessCheckpoint, pids: tuple[int, ...]) -> None:
    """Each checkpointed process brought back; the first failure raised once all were
    tried."""
    failed: CheckpointError | None = None
    for pid in pids:
        try:
            driver.restore(pid)
        except CheckpointError as exc:
            failed = failed or exc
    if failed:
        raise failed
