"""What the manager's routes share (one object, reached through one dependency): its
settings, the sessions, the metrics sampler and unit monitor, the save lock, and the
saved config's prepared plan, kept until the file, a model folder or vLLM's patch state
changes (the page polls every 2 s; planning reads model folders)."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request

from vllm_offload import config as config_mod
from vllm_offload import deployment
from vllm_offload.box.prepare import PreparedBox, control_socket, prepare_box, several
from vllm_offload.box.prepare import single as single_config
from vllm_offload.config import DeploymentConfig
from vllm_offload.deployment import Prepared, model_dir, model_roots
from vllm_offload.errors import Refused, VllmOffloadError
from vllm_offload.hardware import HostFacts, probe
from vllm_offload.manager import bounded
from vllm_offload.manager.auth import Sessions
from vllm_offload.manager.metrics import Sampler
from vllm_offload.manager.pulls import Pulls
from vllm_offload.manager.reach import server_url
from vllm_offload.manager.unit_monitor import UnitMonitor
from vllm_offload.model import facts as model_facts
from vllm_offload.systemd.control import Systemd
from vllm_offload.upstream import version as vllm_version
from vllm_offload.upstream.patch_journal import STATE_FILE

# A prepared plan is planned again after this long even when nothing it read changed: the
# host's free RAM (an 'auto' CPU tier's size) moves.
PLAN_MAX_AGE_S = 60.0

AnyPrepared = Prepared | PreparedBox


@dataclass(kw_only=True)
class ManagerSettings:
    config_path: Path
    token: str
    unit: str = "vllm"
    systemd: Systemd = field(default_factory=Systemd)
    sample_interval_s: float = 1.0
    # The machine the plans are made for: this one, or one a test declares (as ollama's
    # scheduler takes its GPU discovery).
    host: Callable[[], HostFacts] = probe
    token_file: Path | None = None  # None: the token was printed at start (the login says)


class Manager:
    def __init__(self, settings: ManagerSettings) -> None:
        self.settings = settings
        self.sessions = Sessions(token=settings.token)
        self.saving = threading.Lock()  # one save at a time: the If-Match check and the write
        self.sampler = Sampler(
            server_url=server_url(config_mod.load(settings.config_path)),
            interval_s=settings.sample_interval_s,
        )
        self.monitor = UnitMonitor(
            systemd=settings.systemd,
            unit=settings.unit,
            sampler=self.sampler,
            limits=self.manager_section,
        )
        self.pulls = Pulls()  # hub models the API fetches (manager.hub_models)
        self._kept: tuple[tuple[Any, ...], float, AnyPrepared | VllmOffloadError] | None = None
        self._keeping = threading.Lock()

    def load(self) -> DeploymentConfig:
        """The saved config; a file that cannot be used refuses whatever needs it (409)."""
        try:
            return config_mod.load(self.settings.config_path)
        except config_mod.ConfigError as exc:
            raise Refused(exc.field, exc.message) from None

    def manager_section(self) -> config_mod.ManagerSection:
        """[manager] as the file says now; its defaults (no automatic restart) while the
        file cannot be read."""
        try:
            return config_mod.load(self.settings.config_path).manager
        except config_mod.ConfigError:
            return config_mod.ManagerSection()

    def prepare(self, config: DeploymentConfig, saved: DeploymentConfig) -> AnyPrepared:
        """What `vllm-offload serve` would do with ``config`` on this host (the same checks
        and words), its models confined to the roots the ``saved`` file sets; within a time
        bound (it reads model folders and the disk tier's)."""
        host, roots = self.settings.host, model_roots(saved)
        vllm = vllm_version.find()

        def plan() -> AnyPrepared:
            if several(config):
                return prepare_box(config, host(), os.environ, vllm, roots=roots)
            return deployment.prepare(single_config(config), host(), os.environ, vllm, roots=roots)

        return bounded.call(plan, "model.path", "reading the model folder")

    def startable(self, config: DeploymentConfig, saved: DeploymentConfig) -> AnyPrepared:
        """``prepare``, refusing (409, the first reason) what `serve` would refuse."""
        prepared = self.prepare(config, saved)
        if prepared.problems:
            first = prepared.problems[0]
            raise Refused(first.field, first.message)
        return prepared

    def prepared_saved(self, config: DeploymentConfig) -> AnyPrepared | VllmOffloadError:
        """The saved config's prepared plan (or why there is none), kept while nothing it
        read has changed."""
        with self._keeping:
            key = self._freshness(config)
            kept = self._kept
            if kept is not None and kept[0] == key and time.monotonic() - kept[1] < PLAN_MAX_AGE_S:
                return kept[2]
            answer: AnyPrepared | VllmOffloadError
            try:
                answer = self.prepare(config, config)
            except VllmOffloadError as exc:
                answer = exc
            self._kept = (key, time.monotonic(), answer)
            return answer

    def _freshness(self, config: DeploymentConfig) -> tuple[Any, ...]:
        """What a plan of ``config`` read: the file, each model folder's fingerprint, the
        installed vLLM's patch state."""
        folders = [config.model] if not config.models else config.models
        prints = []
        for entry in folders:
            single = config.model_copy(
                update={"model": config.model.model_copy(update={"path": entry.path})}
            )
            stamp = functools.partial(model_facts.folder_fingerprint, model_dir(single))
            try:
                prints.append(bounded.call(stamp, "model.path", "reading the model folder"))
            except (VllmOffloadError, OSError):
                prints.append("")
        try:
            state = (vllm_version.find().package_dir / STATE_FILE).stat().st_mtime_ns
        except (VllmOffloadError, OSError):
            state = 0
        return (config_mod.file_tag(self.settings.config_path), tuple(prints), state)

    def control_socket(self, config: DeploymentConfig) -> Path:
        """The front door's control socket: where the server's unit keeps it while the
        unit runs, else where a `serve` this user started by hand keeps it (found as that
        serve finds it: residency.runtime_dir, else XDG_RUNTIME_DIR, else
        ~/.cache/vllm-offload/run)."""
        if self.monitor.current()[0].running:
            unit_dir = f"/run/{self.settings.unit}-offload"
            return control_socket(config, {"RUNTIME_DIRECTORY": unit_dir})
        return control_socket(config, os.environ)


def manager_of(request: Request) -> Manager:
    """The routes' one dependency."""
    found: Manager = request.app.state.manager
    return found
