from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_offload.cli import main
from vllm_offload.systemd import install, unit_files
from vllm_offload.systemd.unit_files import InstallError, InstallOptions


def options(root: Path, **kw: object) -> InstallOptions:
    base = InstallOptions(root=root, user="root", state_dir=root.parent / "state")
    return unit_files.validate(InstallOptions(**{**base.__dict__, **kw}))


def verify(unit_file: Path) -> str:
    """systemd-analyze verify's complaints about one unit file ('' when none). Nothing is
    filtered: an invalid value is reported only as a "Failed to parse ..." line."""
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return (done.stdout + done.stderr).strip()


def test_rendered_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "c"
    written = install.install(options(root))
    unit_dir = root / "etc/systemd/system"
    assert sorted(p.name for p in unit_dir.iterdir()) == ["vllm-manager.service", "vllm.service"]
    for unit in unit_dir.iterdir():
        assert verify(unit) == ""
    server = (unit_dir / "vllm.service").read_text()
    for directive in (
        "Restart=on-failure",
        "RestartPreventExitStatus=2",
        "StartLimitBurst=5",
        "TimeoutStopSec=120",
        "LimitMEMLOCK=infinity",
        "LimitNOFILE=65536",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "StandardOutput=journal",
        "EnvironmentFile=-/etc/default/vllm-offload",
        f"ExecStart={sys.executable} -m vllm_offload serve --config /etc/vllm-offload/config.toml",
    ):
        assert directive in server
    assert "PrivateDevices=" not in server  # the GPU lives in /dev
    token = root / "etc/vllm-offload/manager-token"
    assert token in written and oct(token.stat().st_mode & 0o777) == "0o600"
    env = root / "etc/default/vllm-offload"
    # Issue #18: the file once set expandable_segments:True, which vLLM 0.32 refuses with
    # the CPU tier: the default install could not start a GPU server.
    assert not [line for line in env.read_text().splitlines() if not line.startswith("#")]
    # Issue #15: not beside the config, in the directory the manager's user owns (and so
    # could replace the server's environment with LD_PRELOAD).
    assert env.parent != root / "etc/vllm-offload"
    rules = (root / "etc/polkit-1/rules.d/50-vllm-offload.rules").read_text()
    assert 'action.lookup("unit") == "vllm.service"' in rules and 'subject.user == "root"' in rules


def test_verify_catches_a_misspelt_directive(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "c"
    install.install(options(root))
    unit = root / "etc/systemd/system/vllm.service"
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restrat=on-failure"))
    assert "Unknown key" in verify(unit) and "Restrat" in verify(unit)


@pytest.mark.parametrize(
    ("good", "bad"),
    [
        ("LimitMEMLOCK=infinity", "LimitMEMLOCK=infinty"),
        ("NoNewPrivileges=yes", "NoNewPrivileges=yess"),
        ("Restart=on-failure", "Restart=on-failur"),
    ],
)
def test_verify_catches_an_invalid_value(tmp_path: Path, good: str, bad: str) -> None:
    """Issue #14: these are reported only as "Failed to parse ..." lines, which the test
    used to filter out."""
    root = tmp_path / "a" / "b" / "c"
    install.install(options(root))
    unit = root / "etc/systemd/system/vllm.service"
    unit.write_text(unit.read_text().replace(good, bad))
    assert "Failed to parse" in verify(unit) and bad.split("=")[1] in verify(unit)


def test_install_keeps_existing_config_and_token_and_uninstall_removes_what_it_added(
    tmp_path: Path,
) -> None:
    root = tmp_path / "a" / "b" / "c"
    (root / "etc/vllm-offload").mkdir(parents=True)
    (root / "etc/vllm-offload/config.toml").write_text("[server]\nport = 8123\n")
    (root / "etc/other.conf").write_text("not ours")
    install.install(options(root))
    token = (root / "etc/vllm-offload/manager-token").read_text()
    install.install(options(root))  # again: idempotent, the token stays
    assert (root / "etc/vllm-offload/manager-token").read_text() == token
    assert (root / "etc/vllm-offload/config.toml").read_text() == "[server]\nport = 8123\n"
    removed = install.uninstall(root, tmp_path / "a" / "b" / "state")
    assert root / "etc/systemd/system/vllm.service" in removed
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert left == ["etc/other.conf", "etc/vllm-offload/config.toml"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--user", "no-such-user-xyz"], "--user 'no-such-user-xyz': no such user"),
        (["--root", "relative/dir"], "--root relative/dir: must be an absolute path"),
        (["--unit", "vllm;rm -rf /"], "--unit: unit name 'vllm;rm -rf /'"),
        (["--unit", "$(reboot)"], "--unit: unit name '$(reboot)'"),
        (["--config", "/nonexistent/config.toml"], "--config /nonexistent/config.toml: no such"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    root = tmp_path / "a" / "b" / "c"
    argv = [
        "install-service",
        "--user",
        "root",
        "--root",
        str(root),
        "--state-dir",
        str(tmp_path / "state"),
        *args,
    ]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not root.exists() and not (tmp_path / "state").exists()
    assert not (Path("relative").exists())


def test_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "a" / "b" / "c"
    assert main(["install-service", "--user", "root", "--root", str(root), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert f"=== {root}/etc/systemd/system/vllm.service" in out
    assert not root.exists()
    assert "warning: a unit runs as root" in err  # issue #56: accepted without a word


def test_manifest_lists_relative_paths(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "c"
    install.install(options(root))
    state = root / str(tmp_path / "a/b/state").lstrip("/")  # --root holds the state dir too
    manifest = json.loads((state / "installed.json").read_text())
    assert "etc/systemd/system/vllm.service" in manifest
    assert all(not os.path.isabs(p) for p in manifest)


def test_both_units_are_sandboxed(tmp_path: Path) -> None:
    """Issue #15: `systemd-analyze security` scored both units 7.7-8.0 "exposed"."""
    import re

    root = tmp_path / "a" / "b" / "c"
    install.install(options(root))
    for name in ("vllm.service", "vllm-manager.service"):
        done = subprocess.run(
            [
                "systemd-analyze",
                "security",
                "--offline=true",
                "--no-pager",
                str(root / "etc/systemd/system" / name),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        match = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
        assert match is not None, done.stdout + done.stderr
        assert float(match.group(1)) <= 4.5, (name, match.group(1))  # 3.6 / 3.8 here


def test_the_units_grant_exactly_the_disk_tier(tmp_path: Path) -> None:
    """Issue #29: as installed, the server could write only its state directory and the
    manager's user could not delete in the tier: the disk tier and "Clear disk tier"
    could not work. Now the server unit may write kv_offload.disk_path, the manager's the
    tier's folder in it, nothing wider, and the folder is the server's with an ACL for
    the manager's user (the end-to-end proof with two real users: tests/e2e/
    test_disk_tier_install_e2e.py)."""
    from vllm_offload import config as config_mod
    from vllm_offload import disk_layout

    disk = tmp_path / "nvme" / "kv"
    config = tmp_path / "etc" / "config.toml"
    config_mod.save(
        config_mod.with_overrides(
            config_mod.DeploymentConfig(), {"kv_offload.disk_path": str(disk)}
        ),
        config,
    )
    root = tmp_path / "a" / "b" / "c"
    install.install(options(root, config=config, config_given=True, manager_user="nobody"))
    units = root / "etc/systemd/system"
    writable = {
        unit.name: next(
            line for line in unit.read_text().splitlines() if line.startswith("ReadWritePaths=")
        )
        .split("=", 1)[1]
        .split()
        for unit in units.iterdir()
    }
    state = str(tmp_path / "a" / "b" / "state")
    assert writable["vllm.service"] == [state, f"-{disk}"]
    tier = disk_layout.tier_root(str(disk))
    assert writable["vllm-manager.service"] == [str(config.parent), state, f"-{tier}"]
    assert verify(units / "vllm.service") == ""  # ("nobody" makes the other one complain)
    made = root / str(tier).lstrip("/")  # under --root, as every file install writes
    # the owner all, others nothing; the group bits are the ACL's mask now (rwx)
    assert made.is_dir() and oct(made.stat().st_mode & 0o707) == "0o700"
    acl = os.getxattr(made, "system.posix_acl_default")
    assert (65534).to_bytes(4, "little") in acl  # nobody, the manager's user here
    assert os.getxattr(made, "system.posix_acl_access") == acl
    assert not os.listxattr(made.parent)  # nothing wider: disk_path itself is untouched


@pytest.mark.parametrize("disk_path", ["/nvme/my kv", "/nvme/%h", "/nvme/a\\b"])
def test_a_disk_path_a_unit_cannot_name_is_refused(tmp_path: Path, disk_path: str) -> None:
    from vllm_offload import config as config_mod

    config = tmp_path / "config.toml"
    config_mod.save(
        config_mod.with_overrides(
            config_mod.DeploymentConfig(), {"kv_offload.disk_path": disk_path}
        ),
        config,
    )
    with pytest.raises(InstallError, match=r"kv_offload\.disk_path"):
        install.install(options(tmp_path / "root", config=config, config_given=True))
    assert not (tmp_path / "root" / "etc").exists()  # nothing written


def test_a_linked_tier_folder_is_refused(tmp_path: Path) -> None:
    from vllm_offload import config as config_mod
    from vllm_offload import disk_layout

    root = tmp_path / "root"
    disk = "/nvme/kv"
    config = tmp_path / "config.toml"
    config_mod.save(
        config_mod.with_overrides(config_mod.DeploymentConfig(), {"kv_offload.disk_path": disk}),
        config,
    )
    (root / "nvme/kv").mkdir(parents=True)
    (root / "nvme/kv" / disk_layout.TIER_DIR).symlink_to(tmp_path)
    with pytest.raises(InstallError, match="symbolic link"):
        install.install(options(root, config=config, config_given=True, manager_user="nobody"))
    assert not os.listxattr(tmp_path)


def test_a_reinstall_writes_nothing_through_links_the_services_users_planted(
    tmp_path: Path,
) -> None:
    """Found re-reading for #29: install wrote each file through a fixed temp name
    (.manager-token.tmp) in the config directory the manager's user owns, then chmod-ed and
    chown-ed it to that user, following a link planted there: a re-install handed any
    file to the manager's user. The manifest in the server's state directory was written
    through a link too, and uninstall deleted whatever that file listed."""
    root = tmp_path / "a" / "b" / "c"
    opts = options(root, manager_user="nobody")
    install.install(opts)
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    victim.chmod(0o644)
    token = root / "etc/vllm-offload/manager-token"
    token.unlink()  # the manager's user may (it owns the directory)
    (token.parent / ".manager-token.tmp").symlink_to(victim)
    install.install(opts)
    assert victim.read_text() == "root's file"
    assert (victim.stat().st_uid, victim.stat().st_mode & 0o777) == (0, 0o644)
    assert token.is_file() and not token.is_symlink() and token.stat().st_uid == 65534
    manifest = root / str(opts.state_dir).lstrip("/") / install.MANIFEST
    manifest.unlink()  # the server's user may (it owns its state directory)
    manifest.symlink_to(victim)
    with pytest.raises(InstallError, match="not install-service's manifest"):
        install.install(opts)
    assert victim.read_text() == "root's file"
    manifest.unlink()  # a manifest the server's user wrote, naming root's file
    manifest.write_text(json.dumps([str(victim.relative_to(root.anchor))]))
    os.chown(manifest, 65534, 65534)
    with pytest.raises(InstallError, match="not written by"):
        install.uninstall(root, opts.state_dir)
    assert victim.exists()


def test_a_cluster_config_adds_the_routers_unit(tmp_path: Path) -> None:
    """Issue #44: with [[cluster.boxes]] this box also runs the router, sandboxed like ours;
    the API key stays in its file (not in ExecStart)."""
    import re

    from vllm_offload.config import ClusterBox, ClusterSection, DeploymentConfig, save

    config = tmp_path / "cluster.toml"
    boxes = [ClusterBox(name="a", url="http://10.0.0.1:8000", models=["chat"])]
    key = "/etc/vllm-offload/api-key"
    save(DeploymentConfig(cluster=ClusterSection(boxes=boxes, api_key_file=key)), config)
    root = tmp_path / "a" / "b" / "c"
    install.install(options(root, config=config, config_given=True))
    unit = root / "etc/systemd/system/vllm-router.service"
    assert verify(unit) == ""
    text = unit.read_text()
    assert (
        f"ExecStart={sys.executable} -m vllm_offload.cluster_router --config={config} "
        "--manifest=/run/vllm-router/workers.json"
    ) in text
    assert "RuntimeDirectory=vllm-router" in text and key not in text
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert match is not None and float(match.group(1)) <= 4.5, done.stdout
    install.install(options(root / "single"))  # one box: no router
    assert not (root / "single/etc/systemd/system/vllm-router.service").exists()
