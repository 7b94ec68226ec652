"""Issue #38 item 4: install-service checks, for the units' real users, that they can run
the interpreter and read the packages, config and model folders; its dry run works before
the user exists, says first what it would install and why it would be refused, and never
prints the manager's token. The walk over modes and ACLs is checked against the kernel's
own answer for a real user."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_offload.cli import main
from vllm_offload.systemd import access

needs_users = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="creates a real user: needs root and useradd",
)
SYSTEM_PYTHON = "/usr/bin/python3"  # others may run it (the venv's may live under /root)


@pytest.fixture
def user() -> Iterator[str]:
    name = f"vo-chk-{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        timeout=60,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], timeout=60)


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder other users can enter (pytest's own are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="vllm-offload-check-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX access ACL as its extended attribute holds it (tag, perms, id)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


NO_ID = 0xFFFFFFFF


def kernel_lets(user: str, flag: str, path: Path) -> bool:
    return (
        subprocess.run(
            ["runuser", "-u", user, "--", "test", flag, str(path)], timeout=60
        ).returncode
        == 0
    )


@needs_users
@pytest.mark.parametrize(
    ("folder_mode", "file_mode", "named"),
    [
        (0o755, 0o644, None),
        (0o700, 0o644, None),  # root's home: nothing under it is reachable
        (0o711, 0o600, None),
        (0o711, 0o640, None),
        (0o700, 0o644, ("folder", 5)),  # an ACL grants the user the folder
        (0o711, 0o600, ("file", 4)),  # ... or the file
        (0o711, 0o600, ("file", 0)),  # an ACL entry that grants nothing
    ],
)
def test_the_walk_agrees_with_the_kernel(
    user: str, base: Path, folder_mode: int, file_mode: int, named: tuple[str, int] | None
) -> None:
    folder = base / "private"
    folder.mkdir(mode=folder_mode)
    folder.chmod(folder_mode)
    file = folder / "config.json"
    file.write_text("{}")
    file.chmod(file_mode)
    if named is not None:  # the owner's, group's and others' bits kept, one user added
        target = folder if named[0] == "folder" else file
        mode = target.stat().st_mode
        os.setxattr(
            target,
            "system.posix_acl_access",
            acl(
                (0x01, mode >> 6 & 7, NO_ID),
                (0x02, named[1], access.Who.of(user).uid),
                (0x04, mode >> 3 & 7, NO_ID),
                (0x10, 7, NO_ID),
                (0x20, mode & 7, NO_ID),
            ),
        )
    who = access.Who.of(user)
    walked = access.blocked(file, who, access.READ)
    assert (walked is None) == kernel_lets(user, "-r", file), walked


@needs_users
def test_an_interpreter_the_user_cannot_reach_is_refused(
    user: str, base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private = base / "home"  # as /root, 0700: a pyenv Python under it starts as 203/EXEC
    (private / "bin").mkdir(parents=True)
    private.chmod(0o700)
    (private / "bin" / "python").symlink_to(SYSTEM_PYTHON)
    root = tmp_path / "image"
    argv = [
        "install-service",
        "--user",
        user,
        "--root",
        str(root),
        "--state-dir",
        str(tmp_path / "state"),
        "--python",
        str(private / "bin" / "python"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"the interpreter the units run (ExecStart): {user} cannot enter {private}" in err
    assert not root.exists()  # nothing written
    private.chmod(0o711)  # the fix the message gives: search on the folders on the way
    assert main(argv) == 0, capsys.readouterr().err
    assert (root / "etc/systemd/system/vllm.service").is_file()


@needs_users
def test_a_model_folder_the_user_cannot_read_is_refused(
    user: str, base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = base / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    (model / "model.safetensors").chmod(0o600)
    config = base / "config.toml"
    config.write_text(f'[model]\npath = "{model}"\n')
    config.chmod(0o644)
    argv = [
        "install-service",
        "--user",
        user,
        "--root",
        str(tmp_path / "image"),
        "--config",
        str(config),
        "--state-dir",
        str(tmp_path / "state"),
        "--python",
        SYSTEM_PYTHON,
        "--dry-run",
    ]
    assert main(argv) == 2
    out = capsys.readouterr().out
    assert (
        f"would be refused: model.path {model}: {user} cannot read "
        f"{model / 'model.safetensors'} (mode 600, owner root)"
    ) in out
    (model / "model.safetensors").chmod(0o644)
    assert main(argv) == 0
    assert f"checked: {user} and {user} can run the interpreter" in capsys.readouterr().out


def test_the_dry_run_works_before_the_user_exists_and_prints_no_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "image"
    argv = ["install-service", "--user", "vo-not-yet-made", "--root", str(root), "--dry-run"]
    assert main(argv) == 2  # it says it would be refused, and shows the rest
    out = capsys.readouterr().out
    first = out.splitlines()[:6]
    assert first[0] == "install-service --dry-run: nothing is written"
    assert any("would be refused: --user 'vo-not-yet-made': no such user" in line for line in first)
    assert "User=vo-not-yet-made" in out and "they point into" in out
    token_file = out[out.index("manager-token (mode 600)") :]
    assert token_file.splitlines()[1] == "(a new random token, kept if one exists; not shown)"
    assert not re.search(r"^[A-Za-z0-9_-]{43}$", out, re.MULTILINE)  # token_urlsafe(32)
    assert not root.exists()


def test_a_hub_id_must_be_downloaded_where_the_server_looks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[model]\npath = "org/tiny"\n')
    state = tmp_path / "state"
    argv = [
        "install-service",
        "--user",
        "root",
        "--root",
        "/",
        "--config",
        str(config),
        "--state-dir",
        str(state),
        "--dry-run",
    ]
    assert main(argv) == 2
    cache = state / ".cache/huggingface/hub"  # the server's HOME is its state directory
    assert (
        f"would be refused: model.path org/tiny: not downloaded where the server looks "
        f"({cache})" in capsys.readouterr().out
    )
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = cache / "models--org--tiny" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text(commit)
    assert main(argv) == 0
    assert "checked: root and root can run" in capsys.readouterr().out
