"""vllm_ext.start_phases (issue #56): vLLM's own loggers, as configured by vLLM, print a
line per phase of a start once, and the shared-memory wait is said for what it is."""

from __future__ import annotations

import logging

import pytest

from tests.vllm_patches.conftest import collect_logs
from vllm_offload.vllm_ext import start_phases


def test_each_phase_once_and_the_wait_said_plainly(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.distributed.device_communicators.shm_broadcast import LONG_WAIT_TIME_LOG_MSG
    from vllm.logger import init_logger

    vllm = logging.getLogger("vllm")
    monkeypatch.setattr(vllm, "level", logging.INFO)  # as vLLM's own logging config sets it
    monkeypatch.setattr(vllm, "handlers", list(vllm.handlers))  # put back afterwards
    shm = logging.getLogger(start_phases.SHM_LOGGER)
    monkeypatch.setattr(shm, "filters", list(shm.filters))
    start_phases.install()
    start_phases.install()  # the plugin may register twice: still one line each
    runner = init_logger("vllm.v1.worker.cpu_model_runner")
    runner.info("Starting to load model %s...", "/models/x")
    runner.info("Warming up model for the compilation...")
    runner.info("Warming up model for the compilation...")
    with collect_logs(start_phases.SHM_LOGGER) as said:
        init_logger(start_phases.SHM_LOGGER).info(LONG_WAIT_TIME_LOG_MSG, 60)  # vLLM's own
    err = capfd.readouterr().err
    assert err.count("vllm-offload: start: loading the weights") == 1
    assert err.count("compiling the model: the first start") == 1
    (line,) = said
    assert "no step from the engine for 60 s: it is busy" in line and "hanging" not in line
