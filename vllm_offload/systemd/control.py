"""One interface over the service manager: status, start, stop, restart, logs.

It runs `systemctl` and `journalctl` (or docker-systemctl-replacement's
`systemctl3`/`journalctl3` where no systemd runs) with argv lists only, never a
shell, and only for unit names that pass ``validate_unit``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vllm_offload.errors import VllmOffloadError

UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,200}$")
TIMEOUT_S = 120


class ServiceError(VllmOffloadError):
    """A bad unit name or a failed systemctl call; the text says which and why."""

    kind = "service"


def validate_unit(name: str) -> str:
    """``name`` (without .service) if it is a plain unit name; ServiceError otherwise."""
    if not UNIT_NAME.match(name) or name.endswith(".service"):
        raise ServiceError(
            f"unit name {name!r}: use letters, digits and _ . @ - only, without '.service'"
        )
    return name


@dataclass(frozen=True, kw_only=True)
class ServiceStatus:
    unit: str
    active_state: str  # active, inactive, failed, activating, ...
    sub_state: str
    main_pid: int | None
    result: str = ""  # systemd's Result (success, exit-code, start-limit-hit, ...); "" if none
    load_state: str = ""  # loaded, not-found (no such unit installed), ...; "" if not said

    @property
    def running(self) -> bool:
        return self.active_state == "active" and self.main_pid is not None

    @property
    def start_limit_hit(self) -> bool:
        """The service manager stopped restarting the unit: too many starts within its
        StartLimitIntervalSec (docker-systemctl-replacement calls this state 'error')."""
        return self.result == "start-limit-hit" or self.active_state == "error"


@dataclass(frozen=True, kw_only=True)
class Systemd:
    """systemctl/journalctl commands; ``root`` for docker-systemctl-replacement's --root."""

    systemctl: tuple[str, ...] = ("systemctl",)
    journalctl: tuple[str, ...] = ("journalctl",)
    root: Path | None = None

    @property
    def _journal_format(self) -> list[str]:
        # journalctl3 (the replacement) prints bare lines and knows no -o.
        return [] if self.journalctl[-1].endswith("journalctl3") else ["-o", "cat"]

    @classmethod
    def detect(cls, root: Path | None = None) -> Systemd:
        """Real systemd where it runs (and no root is given), else systemctl3/journalctl3."""
        if root is None and Path("/run/systemd/system").is_dir():
            return cls()
        # The replacement is a pip package: look beside this interpreter too (a venv's bin).
        search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        ctl = shutil.which("systemctl3", path=search)
        journal = shutil.which("journalctl3", path=search)
        if ctl is None or journal is None:
            if root is not None:  # systemd's own systemctl cannot start units under --root
                raise ServiceError(
                    "--systemd-root needs docker-systemctl-replacement "
                    "(pip install docker-systemctl-replacement)"
                )
            ctl, journal = shutil.which("systemctl"), shutil.which("journalctl")
        if ctl is None or journal is None:
            raise ServiceError(
                "no systemctl found; install systemd or docker-systemctl-replacement"
            )
        return cls(systemctl=(ctl,), journalctl=(journal,), root=root)

    @property
    def replacement(self) -> bool:
        """Whether docker-systemctl-replacement stands in for systemd (no systemd runs)."""
        return self.systemctl[-1].endswith("systemctl3")

    def _root_args(self) -> list[str]:
        return [f"--root={self.root}"] if self.root is not None else []

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ServiceError(
                f"{shlex.join(argv)} did not answer in {TIMEOUT_S} s; the service manager may "
                "be busy: try again, or look at `systemctl status` by hand"
            ) from None

    def _control(self, verb: str, unit: str, *options: str) -> None:
        unit = validate_unit(unit)
        done = self._run([*self.systemctl, *self._root_args(), verb, *options, f"{unit}.service"])
        if done.returncode != 0:
            raise ServiceError(
                f"systemctl {verb} {unit}.service failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )

    def _reset_if_failed(self, unit: str) -> None:
        # systemd refuses to start a unit that hit its start limit ("Start request repeated
        # too quickly") until its failed state is reset; a start by hand means: try again.
        if self.status(unit).active_state == "failed":
            self._control("reset-failed", unit)

    def start(self, unit: str) -> None:
        self._reset_if_failed(unit)
        self._control("start", unit)

    def stop(self, unit: str) -> None:
        self._control("stop", unit)

    def restart(self, unit: str) -> None:
        self._reset_if_failed(unit)
        self._control("restart", unit)

    def kill(self, unit: str) -> None:
        """SIGKILL every process of the unit: a wedged server cannot drain, and a stop would
        wait TimeoutStopSec for it. Its Restart= policy, or a restart, brings it back."""
        self._control("kill", unit, "--signal=SIGKILL")

    def status(self, unit: str) -> ServiceStatus:
        unit = validate_unit(unit)
        done = self._run(
            [
                *self.systemctl,
                *self._root_args(),
                "show",
                f"{unit}.service",
                "-p",
                "ActiveState",
                "-p",
                "SubState",
                "-p",
                "MainPID",
                "-p",
                "Result",
                "-p",
                "LoadState",
            ]
        )
        props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        if done.returncode != 0 and not props:
            raise ServiceError(
                f"{self.systemctl[-1]} show {unit}.service failed "
                f"({done.returncode}): {done.stderr.strip()[-500:]}"
            )
        pid = int(props.get("MainPID") or 0)
        return ServiceStatus(
            unit=unit,
            active_state=props.get("ActiveState", "unknown"),
            sub_state=props.get("SubState", "unknown"),
            main_pid=pid or None,
            result=props.get("Result", ""),
            load_state=props.get("LoadState", ""),
        )

    def logs(self, unit: str, lines: int = 200) -> list[str]:
        unit = validate_unit(unit)
        if not 1 <= lines <= 10_000:
            raise ServiceError(f"lines {lines}: ask for 1 to 10000")
        done = self._run(
            [
                *self.journalctl,
                *self._root_args(),
                "-u",
                f"{unit}.service",
                "-n",
                str(lines),
                "--no-pager",
                *self._journal_format,
            ]
        )
        return done.stdout.splitlines()[-lines:]
