"""One model's vLLM server as a child process of the front door, reached over its own unix
socket: started, health-checked, put to sleep or stopped, woken or started again.

The socket lives in a directory only the server's user may enter, so the engine's
development routes (``/sleep``, ``/wake_up``, ``/collective_rpc``...: vLLM opens them with
``VLLM_SERVER_DEV_MODE=1``, which sleep mode needs) are reachable by the front door alone;
the front door forwards OpenAI routes only. Each engine's output goes to the front door's
stderr (the journal), each line prefixed with its model's name; its last lines are kept to
say why it failed. An engine is put to sleep only once its output said our sleep backend
runs (vllm_ext.SLEEP_BACKEND_LINE, which our plugin prints in each vLLM process): with
vLLM's own it would keep more host RAM than planned, so it is stopped instead (issue #43).
In deep sleep (``residency.deep_sleep``) an engine put to sleep is checkpointed too, and
restored before its wake (``box.process_checkpoint``); where either fails it is stopped,
and started again when asked for: the plan counted no GPU memory for it while away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from vllm_offload.box.process_checkpoint import (
    CheckpointError,
    ProcessCheckpoint,
    checkpoint_all,
    restore_all,
)
from vllm_offload.upstream.client import FRESH_CONNECTIONS
from vllm_offload.vllm_ext import SLEEP_BACKEND_LINE

# A large model's start (weights read, CUDA graphs captured, the CPU tier allocated) takes
# minutes; a level-1 sleep of a 16 GB model ~0.35 s once its host buffers exist, the first
# one ~8 s (measured on the H200: issue #31).
START_TIMEOUT_S = 900.0
SLEEP_TIMEOUT_S = 600.0
# SIGTERM, then SIGKILL to the engine's whole process group after this long: vLLM's own
# shutdown of a serving engine took 8.5 s with two 8B engines up (H100, issue #43); one still
# starting has nothing to finish, and its shutdown could hang past 45 s there.
STOP_GRACE_S = 20.0
STARTING_GRACE_S = 5.0
LOG_TAIL_LINES = 40
MAX_LINE_CHARS = 8192

Idle = Literal["sleep", "stop"]
State = Literal["stopped", "starting", "serving", "asleep", "stopping", "failed"]


class EngineError(Exception):
    """An engine did not start, sleep or wake; the text says why (its log's last error)."""


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    name: str  # the served model name
    command: tuple[str, ...]  # `vllm-offload serve ... --uds SOCKET` for this model alone
    env: dict[str, str]
    socket: Path
    idle: Idle
    sleep_level: int = 1


def uds_client(socket_path: Path, timeout: httpx.Timeout | float) -> httpx.AsyncClient:
    """A client of one engine's socket, a connection per request (FRESH_CONNECTIONS)."""
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(socket_path), limits=FRESH_CONNECTIONS),
        base_url="http://engine",
        timeout=timeout,
    )


@dataclass(kw_only=True)
class EngineProcess:
    """Implements the switcher's EngineOps for one spec."""

    spec: EngineSpec
    on_exit: Callable[[str, int], None]  # (model, exit code) when it ends on its own
    state: State = "stopped"
    pid: int | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    ours_sleep: bool = False  # its output said our sleep backend runs (SLEEP_BACKEND_LINE)
    checkpoints: ProcessCheckpoint | None = None  # deep sleep: the driver's calls
    checkpointed: tuple[int, ...] = ()  # its processes the driver holds, while asleep
    _proc: asyncio.subprocess.Process | None = None
    _stopping: bool = False
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def exit_code(self) -> int | None:
        """How its last process ended; None while it runs, or before any ran."""
        return None if self._proc is None else self._proc.returncode

    async def bring_in(self) -> str:
        restored = ""
        if self.checkpointed and self.alive:
            try:
                restored = f"restored (in {await self._restore():.2f} s) and "
            except CheckpointError as exc:
                await self.stop()  # at once: its CUDA calls may be held still
                await self.start()
                return f"started (its restore failed: {exc})"
        if self.alive and self.state == "asleep":
            try:
                await self._wake()
            except EngineError:
                if self.checkpoints is not None:  # awake, holding what the plan gave none
                    await self.stop()
                raise
            self.state = "serving"
            return restored + "woke"
        await self.start()
        return "started"

    async def put_away(self) -> str:
        if self.spec.idle == "sleep" and self.alive and not self.ours_sleep:
            # vLLM's own backend would keep more host RAM than planned: stop it instead
            await self.stop()
            return "stopped (its output never said our sleep backend runs)"
        if self.spec.idle == "sleep" and self.alive:
            level = self.spec.sleep_level
            await self._call("POST", f"/sleep?level={level}&mode=abort", "sleep")
            self.state = "asleep"
            return "slept" if self.checkpoints is None else await self._checkpoint()
        await self.stop()
        return "stopped"

    async def _wake(self) -> None:
        if self.spec.sleep_level == 2:  # its weights were dropped: read them again
            await self._call("POST", "/wake_up?tags=weights", "wake")
            await self._call("POST", "/collective_rpc", "reload", {"method": "reload_weights"})
            await self._call("POST", "/wake_up?tags=kv_cache", "wake")
        else:
            await self._call("POST", "/wake_up", "wake")

    async def _checkpoint(self) -> str:
        """Its CUDA processes checkpointed (deep sleep); a failure stops it at once (it may
        be locked, or in the driver's failed state)."""
        assert self.checkpoints is not None and self._proc is not None
        proc, began = self._proc, time.monotonic()
        try:  # the leader of its own session (start_new_session)
            pids = await asyncio.to_thread(checkpoint_all, self.checkpoints, proc.pid)
        except CheckpointError as exc:
            await self.stop(at_once=True)
            return f"stopped (its checkpoint failed: {exc})"
        if proc is not self._proc or self._stopping:  # stopped meanwhile: none to restore
            return "stopped"
        self.checkpointed = pids
        return f"slept and checkpointed (in {time.monotonic() - began:.2f} s)"

    async def _restore(self) -> float:
        """Its checkpointed processes brought back; the seconds it took."""
        assert self.checkpoints is not None
        began = time.monotonic()
        await asyncio.to_thread(restore_all, self.checkpoints, self.checkpointed)
        self.checkpointed = ()
        return time.monotonic() - began

    async def start(self) -> None:
        if self.alive:
            await self.stop()
        self.spec.socket.unlink(missing_ok=True)
        self.state, self._stopping, self.ours_sleep = "starting", False, False
        self.checkpointed = ()
        self._proc = await asyncio.create_subprocess_exec(
            *self.spec.command,
            env=self.spec.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: a stuck stop kills all of it
        )
        self.pid = self._proc.pid
        self._spawn(self._pump(self._proc))
        self._spawn(self._watch(self._proc))
        began = time.monotonic()
        async with uds_client(self.spec.socket, 5.0) as engine:
            while time.monotonic() - began < START_TIMEOUT_S:
                if not self.alive:
                    self.state = "failed"
                    raise EngineError(
                        f"exited ({self._proc.returncode}) while starting: {self.last_error()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await engine.get("/health")).status_code == 200:
                        self.state = "serving"
                        return
                await asyncio.sleep(0.25)
        await self.stop()
        self.state = "failed"
        raise EngineError(f"not healthy within {START_TIMEOUT_S:.0f} s: {self.last_error()}")

    async def stop(self, at_once: bool = False) -> None:
        """SIGTERM (vLLM's own shutdown: its processes follow), SIGKILL to its whole process
        group after STARTING_GRACE_S while it starts, STOP_GRACE_S once it served; then
        SIGKILL to what is left of the group (a child that outlived its parent). At once
        (no SIGTERM) where it is checkpointed: its shutdown would wait on the CUDA calls
        the driver holds."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            self.state = "stopped"
            return
        grace = STARTING_GRACE_S if self.state == "starting" else STOP_GRACE_S
        self._stopping, self.state = True, "stopping"
        if not (self.checkpointed or at_once):
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), grace)
        self.checkpointed = ()
        with contextlib.suppress(ProcessLookupError):  # none left: the usual case
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        self.state = "stopped"

    async def _call(
        self, method: str, path: str, what: str, body: dict[str, str] | None = None
    ) -> None:
        if not self.alive:
            raise EngineError(f"cannot {what}: the engine is not running")
        async with uds_client(self.spec.socket, SLEEP_TIMEOUT_S) as engine:
            try:
                response = await engine.request(method, path, json=body)
            except httpx.HTTPError as exc:
                raise EngineError(f"{what} failed: {exc}") from None
        if response.status_code != 200:
            raise EngineError(f"{what} answered {response.status_code}: {response.text[:300]}")

    def last_error(self) -> str:
        errors = [line for line in self.tail if "Error" in line or "error" in line]
        return (errors or list(self.tail) or ["no output"])[-1][-500:]

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pump(self, proc: asyncio.subprocess.Process) -> None:
        """The engine's output to the journal, line by line, by chunks: a line past
        asyncio's 64 KiB limit once ended the pump, and the engine then blocked on a full
        pipe. A line is cut at MAX_LINE_CHARS."""
        assert proc.stdout is not None
        prefix = f"[{self.spec.name}] "
        pending = b""
        while chunk := await proc.stdout.read(1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > MAX_LINE_CHARS:
                lines, pending = [*lines, pending], b""
            for raw in lines:
                self._said(prefix, raw[:MAX_LINE_CHARS].decode(errors="replace"))
        if pending:
            self._said(prefix, pending[:MAX_LINE_CHARS].decode(errors="replace"))

    def _said(self, prefix: str, line: str) -> None:
        self.ours_sleep = self.ours_sleep or SLEEP_BACKEND_LINE in line
        self.tail.append(line)
        sys.stderr.write(prefix + line + "\n")

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if not self._stopping and proc is self._proc:
            self.state, self.checkpointed = "failed", ()
            self.on_exit(self.spec.name, code)
