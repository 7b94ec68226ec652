"""Systemd against a real systemctl implementation (systemctl3, no systemd runs here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vllm_offload.systemd.control import ServiceError, Systemd
from vllm_offload.upstream.client import wait_until

BIN = Path(sys.executable).parent


def test_a_start_by_hand_resets_a_failed_unit_and_starts_it(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    root = tmp_path / "a" / "b" / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/vllm.service").write_text(
        "[Unit]\nDescription=fails until the file exists\n[Service]\n"
        f"ExecStart=/bin/sh -c 'test -e {ready} && exec sleep 600'\n"
    )
    systemd = Systemd(
        systemctl=(str(BIN / "systemctl3"),), journalctl=(str(BIN / "journalctl3"),), root=root
    )
    with pytest.raises(ServiceError, match=r"systemctl start vllm\.service failed"):
        systemd.start("vllm")
    wait_until(lambda: systemd.status("vllm").active_state == "failed", 60, "the failed state")
    ready.touch()
    try:
        systemd.start("vllm")  # reset-failed, then start
        status = systemd.status("vllm")
        assert status.running and status.result == ""  # systemctl3 reports no Result
    finally:
        systemd.stop("vllm")


def test_a_service_manager_that_does_not_answer_is_a_service_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #14: a systemctl call past its timeout escaped as subprocess.TimeoutExpired
    (HTTP 500 from the manager, after the config was saved)."""
    import vllm_offload.systemd.control as service

    hung = tmp_path / "systemctl"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    monkeypatch.setattr(service, "TIMEOUT_S", 1)
    with pytest.raises(ServiceError, match="did not answer in 1 s") as info:
        Systemd(systemctl=(str(hung),), journalctl=(str(hung),)).restart("vllm")
    assert info.value.exit_code == 1 and info.value.http_status == 502
