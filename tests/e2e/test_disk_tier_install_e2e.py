"""Issue #29 (functional): as installed, the server unit could write only its state
directory and the manager's user could not delete in the disk tier, so neither the tier
nor "Clear disk tier" could work. Proven here with two real users, created for the test
(root only): the server unit rendered by install-service, run by systemctl3 as the
server's user, writes a chunk with vLLM's own filesystem-tier write; the manager, a
real process of the manager's user, clears it through its API.

Not provable here: systemd's own ReadWritePaths= and ProtectSystem= (no systemd runs;
systemctl3 ignores them: the rendered lines are checked instead), and UMask= (systemctl3
ignores it: it runs here with the unit's umask, 0027, which the server inherits). vLLM's
CPU platform cannot run the disk tier itself, so the unit's ExecStart is a stand-in that
takes the tier's lock as BoundedFsTier does and writes one chunk as vLLM's fs tier does.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from vllm_offload import disk_layout
from vllm_offload.bench.server_process import free_port
from vllm_offload.config import DeploymentConfig, save, with_overrides
from vllm_offload.systemd import install, unit_files
from vllm_offload.upstream.client import wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("useradd") is None,
        reason="creates two real users: needs root and useradd",
    ),
]
REPO = Path(__file__).resolve().parents[2]
SYSTEMCTL3 = str(Path(sys.executable).parent / "systemctl3")
UMASK = 0o027  # the units' UMask=

STAND_IN = """
import sys, time
from vllm.v1.kv_offload.tiering.fs import io
from vllm_offload import disk_layout
root = disk_layout.tier_root(sys.argv[1])
held = disk_layout.hold(root)  # as BoundedFsTier does before it writes anything
chunk = root / "fp" / "m_0123456789ab_r0" / "abc" / "de_g0" / ("ab" * 32 + ".bin")
io._store_block(str(chunk), memoryview(bytearray(4096)), 0, 4096, use_o_direct=False)
print("stored", chunk, flush=True)
time.sleep(3600)
"""


def python_for_others() -> str:
    """An interpreter other users may run (this venv's may live under root's home):
    this one if every folder above it is open to others, else the system's of the same
    release (the venv's packages are put on PYTHONPATH)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for exe in (os.path.realpath(sys.executable), f"/usr/bin/python{version}"):
        folders = Path(exe).parents
        if os.path.isfile(exe) and all(os.stat(f).st_mode & 0o001 for f in folders):
            return exe
    pytest.skip("no Python interpreter that other users may run")


@pytest.fixture
def users() -> Iterator[tuple[str, str]]:
    """Two new system users: the server's and the manager's."""
    suffix = secrets.token_hex(3)
    names = (f"vo-srv-{suffix}", f"vo-mgr-{suffix}")
    for name in names:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            timeout=60,
        )
    try:
        yield names
    finally:
        for name in names:
            subprocess.run(["userdel", name], timeout=60)


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder other users can reach (pytest's own are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="vllm-offload-tier-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def writable_paths(unit: Path) -> list[str]:
    line = next(s for s in unit.read_text().splitlines() if s.startswith("ReadWritePaths="))
    return line.split("=", 1)[1].split()


def test_the_server_writes_the_tier_and_the_manager_clears_it(
    users: tuple[str, str], base: Path
) -> None:
    server_user, manager_user = users
    python = python_for_others()
    env = {
        "PYTHONPATH": f"{REPO}:{sysconfig.get_paths()['purelib']}",
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
    }
    disk, config, state, root = (
        base / "nvme",
        base / "etc/config.toml",
        base / "state",
        base / "root",
    )
    save(with_overrides(DeploymentConfig(), {"kv_offload.disk_path": str(disk)}), config)
    state.mkdir(mode=0o755)
    install.install(
        unit_files.validate(
            unit_files.InstallOptions(
                root=root,
                user=server_user,
                manager_user=manager_user,
                config=config,
                config_given=True,
                state_dir=state,
                python=python,
            )
        )
    )
    disk.symlink_to(root / str(disk).lstrip("/"))  # the image's folder at the unit's path
    tier = disk_layout.tier_root(str(disk))
    units = root / "etc/systemd/system"
    assert writable_paths(units / "vllm.service") == [str(state), f"-{disk}"]
    assert writable_paths(units / "vllm-manager.service") == [
        str(config.parent),
        str(state),
        f"-{tier}",
    ]
    server_unit = units / "vllm.service"
    server_unit.write_text(
        "\n".join(
            f"ExecStart={python} {base / 'stand_in.py'} {disk}" if s.startswith("ExecStart=") else s
            for s in server_unit.read_text().splitlines()
        )
    )
    (base / "stand_in.py").write_text(STAND_IN)
    (root / "etc/default/vllm-offload").write_text(f"PYTHONPATH={env['PYTHONPATH']}\n")
    systemctl = [SYSTEMCTL3, f"--root={root}"]
    chunk = tier / "fp/m_0123456789ab_r0/abc/de_g0" / ("ab" * 32 + ".bin")
    port = free_port()
    manager = None
    try:
        subprocess.run([*systemctl, "start", "vllm.service"], check=True, timeout=120, umask=UMASK)
        wait_until(chunk.exists, 300, "the server's chunk file")
        assert chunk.stat().st_uid == pwd.getpwnam(server_user).pw_uid
        token_file = root / str(config.parent).lstrip("/") / "manager-token"  # install's
        token = token_file.read_text().strip()
        manager = subprocess.Popen(
            [
                python,
                "-m",
                "vllm_offload",
                "manager",
                "--port",
                str(port),
                "--token-file",
                str(token_file),
                "--config",
                str(config),
                "--systemd-root",
                str(root),
            ],
            user=manager_user,
            group=grp.getgrgid(pwd.getpwnam(manager_user).pw_gid).gr_name,
            extra_groups=[],
            umask=UMASK,
            env={**env, "HOME": str(state)},
            cwd=state,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(f"{url}/healthz"), 120, "the manager")

        def clear() -> httpx.Response:
            return httpx.post(
                f"{url}/api/cache/clear",
                timeout=60,
                headers={"Authorization": f"Bearer {token}"},
            )

        busy = clear()
        assert busy.status_code == 409 and "running server" in busy.text, busy.text
        subprocess.run([*systemctl, "stop", "vllm.service"], check=True, timeout=120)
        done = clear()
        assert done.status_code == 200, done.text
        assert done.json() == {"files": 1, "bytes": 4096}
        assert not chunk.exists() and not (tier / "fp").exists()
        # and nothing wider: the manager's user cannot write beside the tier's folder
        beside = subprocess.run(
            [python, "-c", "import sys; open(sys.argv[1], 'w')", str(disk / "planted")],
            user=manager_user,
            timeout=60,
            capture_output=True,
            text=True,
        )
        assert beside.returncode != 0 and "PermissionError" in beside.stderr
    finally:
        subprocess.run([*systemctl, "stop", "vllm.service"], timeout=120)
        if manager is not None:
            manager.terminate()
            manager.wait(timeout=30)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
