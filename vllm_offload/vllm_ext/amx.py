"""Intel AMX on Linux: whether the CPU has it, and whether the kernel lets this process use it.

Linux hands a process AMX's tile registers only after it asks
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, kernel 5.16 and later); the first
tile instruction of a process that did not ask is killed with SIGILL. The permission is
per process, inherited by ``fork`` and cleared by ``execve``.

Why vllm-offload cares: vLLM 0.32's CPU attention runs its AMX kernels whenever
``torch.cpu._is_amx_tile_supported()`` says the CPU has them (bfloat16, blocks a
multiple of 32 tokens), and vLLM never asks for the permission. torch's inductor asks
(``torch.cpu._init_amx()``) while it compiles, so a compiled server ran, while an eager one
(``--enforce-eager``) lost its worker (spawned: a fresh ``execve``) to SIGILL on the first
request. The vLLM plugin (``vllm_ext.plugin``) asks in every vLLM process; the planner
refuses bfloat16 on the CPU platform where the kernel says no.
"""

from __future__ import annotations

import ctypes
import errno
import platform
from collections.abc import Callable
from typing import Literal

# <asm/prctl.h> and <asm/unistd_64.h>, x86-64.
SYS_ARCH_PRCTL = 158
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
CPUINFO = "/proc/cpuinfo"

AmxState = Literal["absent", "granted", "refused"]


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's feature flags in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def read_cpuinfo() -> str:
    try:
        with open(CPUINFO) as f:
            return f.read()
    except OSError:
        return ""


def request_permission() -> int:
    """Ask the kernel for AMX tile data in this process: 0 when granted, else the errno
    (EOPNOTSUPP: the kernel or the VM does not offer AMX; ENOSYS: not x86-64 Linux)."""
    if platform.machine() != "x86_64":
        return errno.ENOSYS
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
        return 0
    return ctypes.get_errno() or errno.EPERM


def state(cpuinfo: str, request: Callable[[], int] = request_permission) -> tuple[AmxState, str]:
    """('absent' | 'granted' | 'refused', the reason in words). ``request`` asks the kernel
    (the seam tests use to declare a host); it is asked only where the CPU reports AMX."""
    if "amx_tile" not in cpu_flags(cpuinfo):
        return "absent", "the CPU reports no AMX (no amx_tile flag)"
    code = request()
    if code == 0:
        return "granted", "the CPU reports AMX and the kernel grants it"
    name = errno.errorcode.get(code, str(code))
    return "refused", f"the CPU reports AMX (amx_tile) but the kernel refuses its use ({name})"
