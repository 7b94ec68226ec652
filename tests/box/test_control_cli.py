"""`vllm-offload ps`, `load` and `unload` (issue #43), as a person runs them: the console
script in its own process, against a front door's control socket served by uvicorn, over
stand-in engine processes (tests/box/standin_engine.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn

from tests.box.test_front import run, standin
from vllm_offload.box.control import create_control_app
from vllm_offload.box.front import FrontDoor
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import Event, ResidencySettings
from vllm_offload.cli.ps_cmd import COLUMNS
from vllm_offload.config import parse, save
from vllm_offload.hardware import GIB

VLLM_OFFLOAD = str(Path(sys.executable).parent / "vllm-offload")
PLANNED = {
    "gpu_bytes_serving": 20 * GIB,
    "host_bytes_serving": 7 * GIB,
    "gpu_bytes_away": 3 * GIB,
    "host_bytes_away": 23 * GIB,
}


@contextlib.asynccontextmanager
async def control_socket(
    tmp_path: Path, gpus: dict[str, tuple[int, ...]] | None = None
) -> AsyncIterator[tuple[Path, Path]]:
    """A front door (chat on the GPU, coder stopped) with its control socket; yields the
    socket and a config of the same two models. ``gpus``: a box with several GPUs."""
    residency_ref: list[Residency] = []
    engines = {
        n: standin(tmp_path, n, lambda name, _c: residency_ref[0].engine_exited(name))
        for n in ("chat", "coder")
    }
    settings = ResidencySettings(min_resident_s=60, keep_alive_s=600)
    residency = Residency(engines, settings, gpus=gpus)
    residency_ref.append(residency)
    front = FrontDoor(
        engines=engines, residency=residency, max_model_len={"chat": 2048, "coder": 4096}
    )
    events: deque[Event] = deque()
    socket = tmp_path / "control.sock"
    app = create_control_app(front, events, {n: PLANNED for n in engines}, gpus)
    server = uvicorn.Server(uvicorn.Config(app, uds=str(socket), log_level="warning"))
    serving = asyncio.create_task(server.serve())
    await residency.bring_in("chat")
    residency.start()
    config = tmp_path / "config.toml"
    save(parse({"models": [{"served_name": "chat"}, {"served_name": "coder"}]}), config)
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        yield socket, config
    finally:
        server.should_exit = True
        await serving
        await residency.stop()
        for engine in engines.values():
            await engine.stop()


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        VLLM_OFFLOAD,
        *args,
        env=dict(os.environ) | (env or {}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def table(text: str) -> dict[str, list[str]]:
    """ps's rows by model: the state, then the rest of the line."""
    rows = {}
    for line in text.splitlines()[1:]:
        name, state, rest = line.split(None, 2)
        rows[name] = [state, rest]
    return rows


def test_ps_load_and_unload(tmp_path: Path) -> None:
    async def test() -> None:
        async with control_socket(tmp_path) as (socket, config):
            where = ("--socket", str(socket), "--config", str(config))
            code, out = await cli("ps", *where)
            assert code == 0, out
            one_gpu = tuple(c for c in COLUMNS if c != "GPUS")  # GPUS: several GPUs only
            assert tuple(out.splitlines()[0].split()) == one_gpu
            rows = table(out)
            assert rows["chat"][0] == "serving" and "20.0 GiB" in rows["chat"][1]
            assert "until" in rows["chat"][1] and "idle, or another model asks" in rows["chat"][1]
            assert rows["coder"][0] == "stopped" and rows["coder"][1].split()[-1] == "?"

            code, out = await cli("load", "coder", *where)
            assert (code, out.strip()) == (0, "'coder' is on the GPU")
            rows = table((await cli("ps", *where))[1])
            assert rows["coder"][0] == "serving" and rows["chat"][0] == "asleep"
            assert "3.0 GiB" in rows["chat"][1] and "23.0 GiB" in rows["chat"][1]

            code, out = await cli("ps", "--json", *where)
            listed = json.loads(out)["models"]
            assert listed["coder"]["since"] is not None and listed["coder"]["turn_ends"]
            assert listed["coder"]["expected_wait_s"] == 0.0
            # chat's wait: coder's turn (60 s, unused: none) and a switch as chat's took
            assert 0 <= listed["chat"]["expected_wait_s"] < 60

            code, out = await cli("unload", "coder", *where)
            assert (code, out.strip()) == (0, "'coder' is away")
            rows = table((await cli("ps", *where))[1])
            assert rows["coder"][0] == "asleep" and rows["coder"][1].split()[-1] == "s"
            listed = json.loads((await cli("ps", "--json", *where))[1])["models"]
            assert listed["coder"]["expected_wait_s"] >= 0  # nothing resident: its wake

            code, out = await cli("load", "gpt-4", *where)
            assert code == 2 and "no model 'gpt-4'" in out and "chat, coder" in out

    run(test)


def test_ps_says_each_model_s_gpus_on_a_box_with_several(tmp_path: Path) -> None:
    """Issue #59: chat on GPU 0, coder split over 1 and 2: both serve at once, and ps has
    a GPUS column."""

    async def test() -> None:
        async with control_socket(tmp_path, {"chat": (0,), "coder": (1, 2)}) as (socket, config):
            where = ("--socket", str(socket), "--config", str(config))
            assert (await cli("load", "coder", *where))[0] == 0
            code, out = await cli("ps", *where)
            assert code == 0 and tuple(out.splitlines()[0].split()) == COLUMNS
            rows = table(out)
            assert rows["chat"][0] == "serving" and rows["coder"][0] == "serving"
            assert rows["chat"][1].split("  ")[-1] != ""  # a full row
            assert " 0 " in f" {rows['chat'][1]} " and " 1,2 " in f" {rows['coder'][1]} "

    run(test)


def test_load_finds_the_running_front_door_as_ps_does(tmp_path: Path) -> None:
    """Issue #56: without --config, `ps` found the server's models where `serve` puts its
    socket (XDG_RUNTIME_DIR), and `load` read the default config (one model) and refused."""

    async def test() -> None:
        async with control_socket(tmp_path) as (socket, _config):
            xdg = tmp_path / "xdg"
            (xdg / "vllm-offload").mkdir(parents=True)
            (xdg / "vllm-offload" / "control.sock").symlink_to(socket)
            home = {"XDG_RUNTIME_DIR": str(xdg)}
            assert {"chat", "coder"} <= set(table((await cli("ps", env=home))[1]))
            code, out = await cli("load", "coder", env=home)
            assert (code, out.strip()) == (0, "'coder' is on the GPU")

    run(test)


def test_no_front_door_is_said_clearly(tmp_path: Path) -> None:
    async def test() -> None:
        config = tmp_path / "one.toml"
        save(parse({"residency": {"runtime_dir": str(tmp_path / "run")}}), config)
        for command in (("ps",), ("load", "x")):
            code, out = await cli(*command, "--config", str(config))
            assert code == 1 and "no front door's control socket" in out and "--socket" in out
            assert "this config names one model" in out

    run(test)
