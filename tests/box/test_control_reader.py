"""The manager's reads of the front door's control socket (issue #37): whoever runs as the
server's user can answer there, so each read has one deadline for the whole exchange, a
size cap, and only a few wait at once; the manager's request threads are never all held.
Before: a reply dripped a byte a second hung every request thread, and a 1.5 GB reply
took the manager from 126 MB to 5.9 GB."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from vllm_offload.box import control
from vllm_offload.upstream.client import wait_until

HOSTILE = str(Path(__file__).with_name("hostile_control.py"))
BOUND_S = 30.0  # a deadline of 1 s, checked with room for a busy box


def hostile(tmp_path: Path, mode: str, size: int = 0) -> Iterator[Path]:
    socket = tmp_path / f"{mode}.sock"
    proc = subprocess.Popen([sys.executable, HOSTILE, str(socket), mode, str(size)])
    wait_until(socket.exists, 60, "the hostile socket", lambda: proc.poll() is None, 0.05)
    yield socket
    proc.kill()
    proc.wait()


@pytest.fixture
def drip(tmp_path: Path) -> Iterator[Path]:
    yield from hostile(tmp_path, "drip")


def test_an_answer_dripped_a_byte_at_a_time_ends_at_the_deadline(drip: Path) -> None:
    began = time.monotonic()
    said = control.read_models(drip, deadline_s=1.0)
    assert isinstance(said, str) and "no whole answer within 1 s" in said
    assert time.monotonic() - began < BOUND_S
    with pytest.raises(control.ControlError):
        control.move(drip, "chat", "bring-in", deadline_s=1.0)


def test_only_a_few_reads_wait_on_a_socket_that_does_not_answer(drip: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        said = list(pool.map(lambda _: control.read_models(drip, deadline_s=5.0), range(8)))
    waiting = [s for s in said if isinstance(s, str) and "still waiting" in s]
    assert len(waiting) >= 8 - control.READERS, said  # told at once, not queued


def test_a_huge_answer_is_cut_at_the_cap(tmp_path: Path) -> None:
    for socket in hostile(tmp_path, "huge", 512 << 20):
        me = psutil.Process()
        before = me.memory_info().rss
        said = control.read_models(socket, deadline_s=60.0)
        assert isinstance(said, str) and f"over {control.MAX_CONTROL_BYTES} bytes" in said
        assert me.memory_info().rss - before < 64 << 20


def test_an_answer_that_is_not_a_front_door_s_is_said(tmp_path: Path) -> None:
    for socket in hostile(tmp_path, "garbage"):
        said = control.read_models(socket, deadline_s=5.0)
        assert isinstance(said, str) and "not JSON" in said
    nothing = control.read_models(tmp_path / "none.sock")
    assert isinstance(nothing, str) and "nothing answers" in nothing


def test_a_bring_in_may_take_longer_than_a_read(tmp_path: Path) -> None:
    """A stopped model's start takes minutes: only the move's own deadline bounds it (the
    first version kept httpx's 5 s read timeout and failed every real bring-in)."""
    for socket in hostile(tmp_path, "slow", 8):
        assert control.move(socket, "chat", "bring-in", deadline_s=120) == (
            200,
            {"status": "in slowly"},
        )
