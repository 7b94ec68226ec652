"""Issue #28: on a CPU with AMX, vLLM's eager CPU worker died with SIGILL on the first
request: Linux grants AMX only to a process that asks, and vLLM's spawned workers never
did. The detection both ways (simulated at the seam: the flags read and the kernel's
answer), the plugin that asks in each vLLM process, and the planner's refusal where the
kernel says no."""

from __future__ import annotations

import errno
import platform
from pathlib import Path

import pytest

from tests.conftest import make_host
from tests.shapes import LLAMA3_8B, write_shape
from vllm_offload import hardware
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.hardware import HostFacts
from vllm_offload.model import facts as model_facts
from vllm_offload.plan import make_plan
from vllm_offload.vllm_ext import amx, plugin

WITH_AMX = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile\n"
WITHOUT_AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


def test_a_cpu_without_amx_is_never_asked_about() -> None:
    asked: list[bool] = []
    state = amx.state(WITHOUT_AMX, lambda: asked.append(True) or 0)
    assert state[0] == "absent" and not asked


@pytest.mark.parametrize(
    ("answer", "expected"),
    [(0, "granted"), (errno.EOPNOTSUPP, "refused"), (errno.EPERM, "refused")],
)
def test_a_cpu_with_amx_asks_the_kernel(answer: int, expected: str) -> None:
    state, why = amx.state(WITH_AMX, lambda: answer)
    assert state == expected
    if expected == "refused":
        assert errno.errorcode[answer] in why


def test_this_hosts_answer_agrees_with_its_flags() -> None:
    """The real syscall: granted only where the CPU reports AMX (CI's CPU may or may not)."""
    code = amx.request_permission()
    if "amx_tile" not in amx.cpu_flags(amx.read_cpuinfo()):
        assert code != 0


def test_vllm_loads_the_plugin_and_it_asks_where_the_cpu_has_amx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    loaded = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)  # vLLM's own loader, every process
    assert loaded.get("vllm_offload") is plugin.register
    asked: list[int] = []
    monkeypatch.setattr(amx, "read_cpuinfo", lambda: WITH_AMX)
    monkeypatch.setattr(amx, "request_permission", lambda: asked.append(1) or 0)
    plugin.register()
    assert asked == [1]
    monkeypatch.setattr(amx, "read_cpuinfo", lambda: WITHOUT_AMX)
    plugin.register()
    assert asked == [1]


def _cpu_plan(tmp_path: Path, host: HostFacts, **overrides: object) -> list[dict[str, str]]:
    model = write_shape(tmp_path / "llama", LLAMA3_8B)  # bfloat16
    config = with_overrides(DeploymentConfig(), {"model.path": str(model), **overrides})
    return list(make_plan(config, model_facts.read(model), host, "cpu").notes.problems)


def test_bfloat16_is_refused_on_the_cpu_where_the_kernel_refuses_amx(tmp_path: Path) -> None:
    refused = HostFacts(
        **{
            **make_host().__dict__,
            "amx": "refused",
            "amx_detail": "the kernel refuses its use (EOPNOTSUPP)",
        }
    )
    problems = _cpu_plan(tmp_path, refused)
    assert [p["field"] for p in problems] == ["model.dtype"]
    assert "SIGILL" in problems[0]["message"] and "float16" in problems[0]["message"]
    assert _cpu_plan(tmp_path, refused, **{"model.dtype": "float16"}) == []
    granted = HostFacts(**{**make_host().__dict__, "amx": "granted"})
    assert _cpu_plan(tmp_path, granted) == []
    assert _cpu_plan(tmp_path, make_host()) == []  # no AMX at all


def test_the_flag_that_counts_is_amx_tile() -> None:
    """Issue #45: both fixtures carried amx_bf16 and amx_tile, so the flag's name could be
    broken unnoticed. amx_tile alone is asked about; amx_bf16 alone is not AMX's tiles."""
    tile_only = "processor\t: 0\nflags\t\t: fpu amx_tile\n"
    bf16_only = "processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_bf16 amx_int8\n"
    assert amx.state(tile_only, lambda: 0)[0] == "granted"
    assert amx.state(bf16_only, lambda: 0)[0] == "absent"


def test_the_syscall_reaches_arch_prctl_s_permission_request() -> None:
    """The constants: a wrong option gives EINVAL, a wrong syscall number another call's
    answer (prctl: EINVAL) or ENOSYS; arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) answers
    0 (granted) or EOPNOTSUPP (no AMX, or a kernel before 5.16 says EINVAL: refused)."""
    if platform.machine() != "x86_64":
        pytest.skip("arch_prctl is x86-64's")
    code = amx.request_permission()
    release = tuple(int(x) for x in platform.release().split(".")[:2])
    if release >= (5, 16):
        assert code in (0, errno.EOPNOTSUPP), errno.errorcode.get(code, code)


def test_the_host_probe_reports_what_the_kernel_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """hardware.probe reads the flags and asks the real kernel (this host's answer)."""
    monkeypatch.setattr(amx, "read_cpuinfo", lambda: WITHOUT_AMX)
    assert hardware.probe().amx == "absent"
    monkeypatch.setattr(amx, "read_cpuinfo", lambda: WITH_AMX)
    expected = "granted" if amx.request_permission() == 0 else "refused"
    assert hardware.probe().amx == expected
