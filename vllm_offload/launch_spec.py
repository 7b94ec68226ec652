"""The launcher's records: what starts one vLLM server (``LaunchSpec``: argv, environment,
KVTransferConfig, plain data so ``--dry-run`` prints it anywhere and a box's engine reads
it back from JSON), an engine's part in a box (``EngineLaunch``), and the refusal of a
start before vLLM would fail (``PreflightError``). ``launch`` builds them from a plan."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from vllm_offload.errors import Refused
from vllm_offload.upstream.version import SERVER_MODULE


class PreflightError(Refused):
    """Something that would make vLLM fail or misbehave here; names the field and the fix."""


@dataclass(frozen=True, kw_only=True)
class EngineLaunch:
    """One engine of several models: it listens on a unix socket only the front door
    reaches, instead of server.host:port, and (sleeps) is put to sleep when away, keeping
    its sleep copy of the weights while it serves or not (keeps_copy, residency.host_copy
    as planned), and with that copy wakes layer by layer or whole (layered_wake), keeping
    up to weights_on_gpu bytes of its weights on the GPU asleep."""

    socket: str
    sleeps: bool
    keeps_copy: bool = True
    layered_wake: bool = False  # residency.layered_wake, at sleep level 1
    weights_on_gpu: int = 0  # residency.asleep_weights_on_gpu_gib as planned, bytes
    gpus: tuple[int, ...] = ()  # its GPUs (NVML indexes) on a box with several; (): all


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    args: tuple[str, ...]
    env: dict[str, str]
    kv_transfer_config: dict[str, Any] | None
    notes: tuple[str, ...] = ()
    secret_env: tuple[str, ...] = field(default=())  # names whose values are never printed
    # What vLLM's own parser must read from ``args`` for each option the launcher writes
    # (its namespace's name -> value), and the administrator's part of ``args``, its tail:
    # argv_check compares the two readings before vLLM starts.
    owned: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()

    def command_line(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", SERVER_MODULE, *self.args]

    def printable(self, python: str = sys.executable) -> str:
        env = " ".join(
            f"{k}={'***' if k in self.secret_env else shlex.quote(v)}"
            for k, v in sorted(self.env.items())
        )
        cmd = shlex.join(self.command_line(python))
        return f"{env} {cmd}" if env else cmd

    def option(self, flag: str) -> str | None:
        """The value the launcher wrote as ``flag=value``; None if it wrote none."""
        return next((a.split("=", 1)[1] for a in self.args if a.startswith(flag + "=")), None)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchSpec:
        return cls(
            args=tuple(data["args"]),
            env=dict(data["env"]),
            kv_transfer_config=data["kv_transfer_config"],
            notes=tuple(data["notes"]),
            secret_env=tuple(data["secret_env"]),
            owned=dict(data["owned"]),
            extra_args=tuple(data["extra_args"]),
        )
