"""Issue #29, items 3 and 4: the disk tier's folder is written by the server's user (so by
any code vLLM runs), and root's `cache clear`, the manager and the planner's probe work
there. Links planted in it are neither followed nor created through; planted FIFOs and
device links are never read."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vllm_offload import disk_facts, disk_layout
from vllm_offload.errors import Refused

BLOCK = "0123456789abcdef.bin"


def within(seconds: float, work: Callable[[], Any]) -> Any:
    """``work()``, failing if it has not returned (or raised) after ``seconds``."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(("value", work()))
        except BaseException as exc:
            result.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    kind, value = result[0]
    if kind == "raised":
        raise value
    return value


def elsewhere(tmp_path: Path) -> Path:
    """What a clear must never touch: block-named files, a lone config.json and an empty
    folder, outside the tier."""
    other = tmp_path / "elsewhere"
    (other / "ns" / "abc").mkdir(parents=True)
    (other / "ns" / "abc" / BLOCK).write_bytes(b"x")
    (other / "ns" / "config.json").write_text("{}")
    (other / "empty").mkdir()
    return other


def snapshot(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_linked_tier_folder_is_refused_not_followed(tmp_path: Path) -> None:
    """`cache clear` (as root) followed a linked vllm-offload-kv folder and deleted block
    files, lone config.json files and empty folders elsewhere."""
    other = elsewhere(tmp_path)
    before = snapshot(other)
    disk = tmp_path / "disk"
    disk.mkdir()
    disk_layout.tier_root(str(disk)).symlink_to(other)
    with pytest.raises(Refused, match="symbolic link") as info:
        disk_layout.clear_tier(str(disk))
    assert info.value.field == "kv_offload.disk_path"
    assert snapshot(other) == before
    assert not (other / disk_layout.LOCK_FILE).exists()
    with pytest.raises(disk_layout.TierLinked):  # the server will not use it either
        disk_layout.hold(disk_layout.tier_root(str(disk)))


def test_links_inside_the_tier_are_neither_followed_nor_deleted(tmp_path: Path) -> None:
    other = elsewhere(tmp_path)
    before = snapshot(other)
    root = disk_layout.tier_root(str(tmp_path / "disk"))
    folder = root / "model_1234_r0" / "abc"
    folder.mkdir(parents=True)
    (folder / BLOCK).write_bytes(b"12345")
    (folder / "de_g0").symlink_to(other / "ns")  # a folder link, as vLLM's layout names them
    (folder / ("f" * 16 + ".bin")).symlink_to(other / "ns" / "abc" / BLOCK)  # a file link
    (root / "model_1234_r0" / "config.json").write_text("{}")
    assert disk_layout.clear_tier(str(tmp_path / "disk")) == (1, 5)
    assert snapshot(other) == before
    assert (folder / "de_g0").is_symlink() and (folder / ("f" * 16 + ".bin")).is_symlink()


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_the_lock_is_never_made_through_a_link_nor_waited_on(tmp_path: Path, planted: str) -> None:
    """Root's clear created the .lock file through a planted link (an empty /etc/nologin
    would lock everyone out); a FIFO there would block it."""
    root = disk_layout.tier_root(str(tmp_path / "disk"))
    root.mkdir(parents=True)
    target = tmp_path / "nologin"
    if planted == "link":
        (root / disk_layout.LOCK_FILE).symlink_to(target)
    else:
        os.mkfifo(root / disk_layout.LOCK_FILE)
    with pytest.raises(Refused, match="cannot lock"):
        within(30, lambda: disk_layout.clear_tier(str(tmp_path / "disk")))
    with pytest.raises(OSError):
        within(30, lambda: disk_layout.hold(root))
    assert not target.exists()


def test_the_odirect_probe_is_never_made_through_a_link(tmp_path: Path) -> None:
    """The planner's probe file had a name anyone could predict (the pid) and was opened
    with O_CREAT through whatever was there."""
    disk = tmp_path / "disk"
    disk.mkdir()
    target = tmp_path / "nologin"
    for pid in range(os.getpid() - 5, os.getpid() + 50):
        (disk / f".vllm-offload-odirect-{pid}").symlink_to(target)
    disk_facts._o_direct.cache_clear()
    facts = disk_facts.probe_disk(str(disk))
    assert facts.exists and facts.writable
    assert not target.exists()
    assert all(p.is_symlink() for p in disk.iterdir())  # nothing left behind either


@pytest.mark.parametrize("planted", ["fifo", "dev-zero", "huge", "garbage"])
def test_the_status_file_is_read_only_when_small_and_regular(tmp_path: Path, planted: str) -> None:
    """A FIFO blocked the manager's status threads for good; a link to /dev/zero was read
    until memory ran out."""
    root = disk_layout.tier_root(str(tmp_path))
    root.mkdir()
    status = root / disk_layout.STATUS_FILE
    if planted == "fifo":
        os.mkfifo(status)
    elif planted == "dev-zero":
        status.symlink_to("/dev/zero")
    elif planted == "huge":
        with status.open("wb") as f:
            f.truncate(disk_layout.MAX_STATUS_BYTES + 1)
    else:
        status.write_text('{"used_bytes": NaN, "files": [1], "max_bytes": 1e999}')
    assert within(30, lambda: disk_layout.read_status(str(tmp_path))) is None
    status.unlink()
    status.write_text('{"used_bytes": 5, "files": 1, "name": "x", "bad": Infinity}')
    assert within(30, lambda: disk_layout.read_status(str(tmp_path))) is None  # not JSON
    status.write_text('{"used_bytes": 5, "files": 1, "name": "x"}')
    assert disk_layout.read_status(str(tmp_path)) == {"used_bytes": 5.0, "files": 1.0}


def test_a_linked_tier_folder_is_a_problem_of_the_deployment(tmp_path: Path) -> None:
    """Said before the server starts (serve exits 2, the page says why), not only by the
    tier's refusal inside vLLM's scheduler."""
    from tests.conftest import make_host
    from vllm_offload import deployment
    from vllm_offload.config import DeploymentConfig, with_overrides
    from vllm_offload.model import demo as demo_model

    model = demo_model.write(tmp_path / "demo")
    disk = tmp_path / "disk"
    disk.mkdir()
    disk_layout.tier_root(str(disk)).symlink_to(tmp_path)
    config = with_overrides(
        DeploymentConfig(), {"model.path": str(model), "kv_offload.disk_path": str(disk)}
    )
    prepared = deployment.prepare(config, make_host(24), {}, None)
    linked = [p for p in prepared.problems if "symbolic link" in p.message]
    assert [p.field for p in linked] == ["kv_offload.disk_path"] and linked[0].exit_code == 2
