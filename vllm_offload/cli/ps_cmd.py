"""`vllm-offload ps`: the models of a running front door (several [[models]]), as the
manager's page shows them: each one's state, since when it is on the GPU and until when it
stays, its planned GPU and host memory, its requests, and the wait a request for it would
see. Read through the front door's control socket."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from vllm_offload.box.control import read_models
from vllm_offload.cli import _common
from vllm_offload.hardware import GIB
from vllm_offload.systemd.control import ServiceError

COLUMNS = ("MODEL", "STATE", "SINCE", "STAYS", "GPUS", "GPU", "HOST", "RUNNING", "WAITING", "WAIT")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "ps",
        help="the models of the running server: state, memory, since/until when",
        description="List the models a running `vllm-offload serve` with several [[models]] "
        "serves: STATE (serving, asleep, stopped, starting, switching, failed), SINCE (when "
        "it came onto the GPU), STAYS (until when: a model used in its turn stays until the "
        "turn ends, residency.min_resident_s, then until another model is asked for or "
        "keep_alive_s passes), GPUS (which GPUs its engine runs on, on a box with several), "
        "GPU and HOST (the plan's memory for its state), RUNNING and "
        "WAITING requests, WAIT (about how long a request for it waits now: its "
        "model's turn and the switch, as the last switches took; ? before the first).",
    )
    _common.add_control_options(parser)
    parser.add_argument("--json", action="store_true", help="print the control socket's answer")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, _extra_args: list[str]) -> int:
    _config, socket = _common.control_socket(args)
    found = read_models(socket)
    if isinstance(found, str):  # why not: nothing there, or not a front door's answer
        raise ServiceError(found)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    models = found["models"].values()
    rows = [COLUMNS] + [row(name, model, time.time()) for name, model in found["models"].items()]
    if len({g for model in models for g in model.get("gpus", [])}) < 2:  # one GPU (or none)
        rows = [r[:4] + r[5:] for r in rows]
    if not any(on_gpu(model) for model in models):  # a CPU host
        rows = [r[:4] + r[5:] for r in rows]
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    if not found.get("ready"):
        print("(starting: the default model is not serving yet)")
    return 0


def on_gpu(model: dict[str, Any]) -> bool:
    """Whether the plan gives ``model`` GPU memory (none on a CPU host: no GPU column)."""
    planned = model.get("planned") or {}
    return any(planned.get(k) for k in ("gpu_bytes_serving", "gpu_bytes_away"))


def clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def stays(model: dict[str, Any], now: float) -> str:
    if model.get("since") is None:
        return "-"
    idle_until = model.get("keep_alive_until")
    until = (
        "until another model is asked for"
        if idle_until is None
        else f"until {clock(idle_until)} idle, or another model asks"
    )
    turn = model.get("turn_ends")
    return f"{until}, not before {clock(turn)}" if turn is not None and turn > now else until


def row(name: str, model: dict[str, Any], now: float) -> tuple[str, ...]:
    state = model["state"]
    planned = model.get("planned") or {}
    on = state in ("serving", "switching")
    gpu = planned.get("gpu_bytes_serving" if on else "gpu_bytes_away")
    host = planned.get("host_bytes_serving" if on else "host_bytes_away")
    if state in ("stopped", "failed"):
        gpu = host = 0
    wait = model.get("expected_wait_s")
    return (
        name,
        state,
        clock(model.get("since")),
        stays(model, now),
        ",".join(map(str, model.get("gpus", []))) or "-",
        size(gpu),
        size(host),
        str(model.get("in_flight", 0)),
        str(model.get("waiting", 0)),
        "?" if wait is None else ("0" if wait == 0 else f"~{wait:g} s"),
    )


def size(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"
