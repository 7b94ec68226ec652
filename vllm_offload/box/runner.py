"""`vllm-offload serve` with several models: the front door in this process (the one systemd
started), the engines as its children. Where not all models fit on the GPU at once,
start-up brings each model that sleeps in once and puts it away (the slow first sleep is
paid here, not by a user's first switch); then it brings in the default and the others
that stay on the GPU beside it.

SIGTERM, SIGINT or SIGHUP, at any moment (an engine still starting included), ends
everything within STOP_BOUND_S: the switches stop and the requests waiting for one fail at
once; the two servers stop taking requests and give those in flight SERVER_GRACE_S; each
engine gets SIGTERM, then SIGKILL to its whole process group after its grace
(engines.STARTING_GRACE_S while it starts, STOP_GRACE_S once it served), all at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import uvicorn

from vllm_offload import http_limits
from vllm_offload.box.control import EVENTS_KEPT, create_control_app
from vllm_offload.box.engines import STOP_GRACE_S, EngineProcess, EngineSpec
from vllm_offload.box.front import FrontDoor, create_front_app
from vllm_offload.box.prepare import CONTROL_SOCKET, ENGINES_DIR, PreparedBox, socket_of
from vllm_offload.box.process_checkpoint import CheckpointError, DriverCheckpoint, ProcessCheckpoint
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import Event, ResidencySettings, Unavailable
from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import Refused
from vllm_offload.plan.box import BoxPlan, ModelPlan

ENGINE_MODULE = "vllm_offload.box.engine"
SERVER_GRACE_S = 5  # uvicorn takes whole seconds
STOP_BOUND_S = max(SERVER_GRACE_S, STOP_GRACE_S) + 10.0  # and reaping what was killed
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the runner (two servers share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def say(text: str) -> None:
    print(f"vllm-offload: {text}", file=sys.stderr, flush=True)


def settings(config: DeploymentConfig, box_plan: BoxPlan) -> ResidencySettings:
    """The switcher's settings: max_resident and min_resident_s as the plan resolved them."""
    residency = config.residency
    keep = None if residency.keep_alive_s == "forever" else float(residency.keep_alive_s)
    return ResidencySettings(
        max_resident=box_plan.max_resident,
        resident_beside={name: m.resident_beside for name, m in box_plan.models.items()},
        min_resident_s=box_plan.min_resident_s,
        keep_alive_s=keep,
        queue_limit=residency.queue_limit,
        drain_timeout_s=residency.drain_timeout_s,
    )


def planned_memory(model: ModelPlan) -> dict[str, int]:
    """The memory the plan gives ``model`` on the GPU and in host RAM, serving and away (an
    engine asleep keeps ASLEEP_GPU_BYTES on the GPU at most, none in deep sleep; a stopped
    one nothing). An engine that sleeps at level 1 keeps the sleep arena's copy of its
    weights while it serves too, unless residency.host_copy gives it back: issue #58 found
    `ps` saying 8.0 GiB serving for an engine holding ~23.6 GiB."""
    plan = model.plan
    gpu = plan.gpu.budget_bytes if plan.platform == "cuda" else 0
    return {
        "gpu_bytes_serving": gpu,
        "host_bytes_serving": model.serving_ram_bytes,
        "gpu_bytes_away": model.away_gpu_bytes,
        "host_bytes_away": model.away_ram_bytes,
    }


def write_specs(prepared: PreparedBox) -> dict[str, Path]:
    """Each engine's launch spec as a file only the server's user reads (beside its
    socket), which its process runs."""
    engines_dir = prepared.runtime_dir / ENGINES_DIR
    prepared.runtime_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(prepared.runtime_dir, 0o750)  # the manager's unit joins the group for control
    engines_dir.mkdir(exist_ok=True)
    os.chmod(engines_dir, 0o700)  # the engines' own routes: the front door's alone
    files = {}
    for i, (name, spec) in enumerate(prepared.specs.items()):
        path = engines_dir / f"{i}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(spec.to_json(), f)
        files[name] = path
    return files


async def warm_up(front: FrontDoor, prepared: PreparedBox, preload: bool) -> None:
    """The models that stay on the GPU in, the default first (then the front door is
    ready). Where not all of them fit at once, every model that sleeps is first brought in
    and put away once (preload), the default too, as any of them may be put away later: a
    first sleep makes the host copy of its weights, 5-11 s for 16 GB on the H200 (the
    default's first put-away made the first switch 6.3 s instead of 0.5), later ones take
    0.05 s; side by side where their GPUs hold them as they start (the plan's
    start_batches). Where all fit, none sleeps: none keeps a host copy of its weights."""
    box_plan, residency = prepared.plan, front.residency
    names = [box_plan.default, *(n for n in box_plan.models if n != box_plan.default)]
    for batch in box_plan.start_batches if preload else ():
        await residency.start_together(batch)
        for name in batch:
            if residency.slots[name].status == "failed":
                say(f"'{name}' did not start; it starts again when asked for")
    await front.residency.bring_in(box_plan.default)
    front.ready = True
    say(f"serving {', '.join(box_plan.models)}; '{box_plan.default}' on the GPU")
    for name in names[1:] if preload else ():
        if residency.full(residency.slots[name]):  # its GPUs hold what they may
            continue
        try:
            await front.residency.bring_in(name)
        except Unavailable as exc:
            say(f"'{name}' did not start ({exc}); it starts again when asked for")


def box_engines(
    prepared: PreparedBox, config: DeploymentConfig, on_exit: Callable[[str, int], None]
) -> dict[str, EngineProcess]:
    """Each model's engine, not started yet: its launch spec written to a file, which
    ``python -m vllm_offload.box.engine`` runs."""
    specs = write_specs(prepared)
    checkpoints = process_checkpoints(prepared.plan)

    def engine(name: str, spec_file: Path) -> EngineProcess:
        command = (sys.executable, "-m", ENGINE_MODULE, str(spec_file))
        idle = prepared.plan.models[name].idle
        spec = EngineSpec(
            name=name,
            command=command,
            env=dict(os.environ),
            socket=socket_of(prepared, name),
            idle=idle,
            sleep_level=config.residency.sleep_level,
        )
        deep = checkpoints if idle == "sleep" else None
        return EngineProcess(spec=spec, on_exit=on_exit, checkpoints=deep)

    return {name: engine(name, path) for name, path in specs.items()}


def process_checkpoints(box_plan: BoxPlan) -> ProcessCheckpoint | None:
    """The NVIDIA driver's process checkpoint where models asleep give their GPU memory to
    host RAM (residency.deep_sleep)."""
    if not box_plan.deep_sleep:
        return None
    try:
        return DriverCheckpoint()
    except CheckpointError as exc:
        raise Refused(
            "residency.deep_sleep",
            f"{exc}: update the NVIDIA driver (570 or newer), or set residency.deep_sleep = false",
        ) from None


def front_config(app: Any, host: str, port: int) -> uvicorn.Config:
    """The front door's server as `serve` runs it (its attack tests run this one too):
    bounded for slow and many clients (http_limits.FRONT_DOOR)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=SERVER_GRACE_S,
        http=http_limits.protocol(http_limits.FRONT_DOOR),
    )


def front_and_control(
    front: FrontDoor,
    events: deque[Event],
    prepared: PreparedBox,
    config: DeploymentConfig,
    control_socket: Path,
) -> tuple[_Server, _Server]:
    """The two servers on one loop: the front door on the configured port, and the
    control app (the manager's) on its unix socket."""
    public = _Server(front_config(create_front_app(front), config.server.host, config.server.port))
    memory = {n: planned_memory(m) for n, m in prepared.plan.models.items()}
    gpus = {n: m.gpus for n, m in prepared.plan.models.items()}
    control = _Server(
        uvicorn.Config(
            create_control_app(front, events, memory, gpus),
            uds=str(control_socket),
            log_level="warning",
            timeout_graceful_shutdown=SERVER_GRACE_S,
            http=http_limits.protocol(http_limits.MANAGER),  # its one client, bounded alike
        )
    )
    return public, control


async def serve_box(prepared: PreparedBox, config: DeploymentConfig) -> int:
    """Serve until SIGTERM (0), or until the default model cannot be brought in (1)."""

    def exited(name: str, code: int) -> None:  # called once the switcher below exists
        say(f"the engine of '{name}' exited ({code})")
        residency.engine_exited(name)

    engines = box_engines(prepared, config, on_exit=exited)
    events: deque[Event] = deque(maxlen=EVENTS_KEPT)

    def record(event: Event) -> None:
        events.append(event)
        took = f" in {event.seconds:.2f} s" if event.seconds is not None else ""
        say(f"{event.text}{took}")

    gpus = {name: m.gpus for name, m in prepared.plan.models.items()}
    residency = Residency(engines, settings(config, prepared.plan), on_event=record, gpus=gpus)
    lengths = {n: m.plan.length.max_model_len for n, m in prepared.plan.models.items()}
    front = FrontDoor(
        engines=engines, residency=residency, max_model_len=lengths, api_key=prepared.api_key
    )
    control_socket = prepared.runtime_dir / CONTROL_SOCKET
    control_socket.unlink(missing_ok=True)
    public, control = front_and_control(front, events, prepared, config, control_socket)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    servers = [asyncio.create_task(s.serve()) for s in (public, control)]
    code = 0
    try:
        await _wait_listening(control, control_socket)
        warm = asyncio.create_task(warm_up(front, prepared, config.residency.preload))
        residency.start()
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({warm, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if warm.done() and warm.exception() is not None:
            default = prepared.plan.default
            say(
                f"error: the default model '{default}' could not start: {warm.exception()}; "
                "stopping"
            )
            # 2: vLLM-offload refused its config (the unit does not restart on it)
            code = 2 if engines[default].exit_code == 2 else 1
        else:
            await stopping
        warm.cancel()
    finally:
        say("stopping")
        public.should_exit = control.should_exit = True
        stops = [asyncio.create_task(engine.stop()) for engine in engines.values()]
        await residency.stop()
        await asyncio.gather(*servers, *stops, return_exceptions=True)
        await front.aclose()
        control_socket.unlink(missing_ok=True)
    return code


async def _wait_listening(server: _Server, socket: Path) -> None:
    while not server.started:
        await asyncio.sleep(0.05)
    os.chmod(socket, 0o660)  # connect() needs write permission: the group's
