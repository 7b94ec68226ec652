from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_offload import config as config_mod
from vllm_offload.config import ConfigError, DeploymentConfig


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_are_safe() -> None:
    config = DeploymentConfig()
    assert config.server.host == "127.0.0.1"
    assert config.kv_offload.backend == "auto"
    assert config.model.max_model_len == "auto"


def test_load_full_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
extra_args = ["--enforce-eager"]
[model]
path = "/models/x"
max_model_len = 8192
[gpu]
memory_utilization = 0.85
[kv_offload]
backend = "native"
cpu_tier_gib = 40
eviction_policy = "arc"
[weights_offload]
cpu_gib = 8
params = ["visual"]
backend = "prefetch"
[parallel]
tensor_parallel_size = 2
distributed_executor_backend = "ray"
[server]
port = 9000
""",
    )
    config = config_mod.load(path)
    assert config.model.max_model_len == 8192
    assert config.kv_offload.cpu_tier_gib == 40.0
    assert config.weights_offload.params == ["visual"]
    assert config.parallel.distributed_executor_backend == "ray"
    assert config.extra_args == ["--enforce-eager"]


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("[model]\nmax_len = 4", "model.max_len", "unknown key"),
        ("[gpu]\nmemory_utilization = 1.5", "gpu.memory_utilization", "less than or equal to 1"),
        ("[server]\nport = 0", "server.port", "greater than or equal to 1"),
        ('[kv_offload]\nbackend = "disk"', "kv_offload.backend", "'native'"),
        ("[kv_offload]\nblock_size = 24", "kv_offload", "power of two"),
        ("[kv_offload]\ncpu_tier_gib = -1", "kv_offload", ">= 0"),
        ("[model]\nmax_model_len = 0", "model", "positive"),
        ("[tiers]\nx = 1", "tiers", "unknown key"),
        ("[kv_offload]\nswap_space = 4", "kv_offload", "kv_offload.cpu_tier_gib"),
        ("[gpu]\nswap_space = 4", "gpu", "[kv_offload]"),
        ("swap_space = 4", "config", "[kv_offload]"),
        # issue #55: a spilled request that never moves, and true read as share 1
        ("[kv_offload]\nspilled_step_share = 5e-324", "kv_offload.spilled_step_share", "0.01"),
        ("[kv_offload]\nspilled_step_share = true", "kv_offload.spilled_step_share", "not true"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_mod.load(write(tmp_path, text))
    assert info.value.field == field
    assert words in info.value.message


def test_garbled_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        config_mod.load(write(tmp_path, "[model\npath="))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        config_mod.load(tmp_path / "nope.toml")


def test_round_trip_and_atomic_save(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "config.toml"
    first = config_mod.with_overrides(DeploymentConfig(), {"server.port": "8123"})
    config_mod.save(first, path)
    assert config_mod.load(path) == first
    second = config_mod.with_overrides(first, {"kv_offload.cpu_tier_gib": "12.5"})
    config_mod.save(second, path)
    assert config_mod.load(path) == second
    assert config_mod.load(path.with_suffix(".toml.bak")) == first
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []


def test_overrides_are_validated() -> None:
    with pytest.raises(ConfigError) as info:
        config_mod.with_overrides(DeploymentConfig(), {"server.port": "http"})
    assert info.value.field == "server.port"


def test_a_failed_write_leaves_the_old_config_intact(tmp_path: Path) -> None:
    """The write fails for real (RLIMIT_FSIZE: the kernel refuses bytes past the limit, as
    on a full disk); the old file and its backup stay as they were, no temp file is left."""
    import subprocess
    import sys

    path = tmp_path / "config.toml"
    config_mod.save(DeploymentConfig(), path)
    before = path.read_bytes()
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from vllm_offload import config as c\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        "big = c.with_overrides(c.DeploymentConfig(), {'extra_args': ['--x'] * 500})\n"
        "try:\n"
        "    c.save(big, Path(sys.argv[1]))\n"
        "except OSError as exc:\n"
        "    print('failed', exc.errno)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith("failed 27"), done.stdout + done.stderr  # EFBIG
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_quotes_round_trip_and_the_file_stays_valid(tmp_path: Path) -> None:
    """Issue #15: a newline in a string value wrote invalid TOML; the server then failed
    and the manager refused to start on the file, which only a shell could fix. Since #37
    control characters are refused (a folder's newline forged journal lines); quotes and
    backslashes still round-trip."""
    value = "a b\"c\\d'e"
    config = config_mod.with_overrides(
        DeploymentConfig(), {"model.path": value, "extra_args": ["--seed", '1"2']}
    )
    path = tmp_path / "config.toml"
    config_mod.save(config, path)
    assert len(path.read_text().splitlines()) == len(config_mod.to_toml(config).splitlines())
    assert config_mod.load(path) == config


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("model.path", "a\x00b", "NUL"),
        ("model.path", "x" * 5000, "longer than 4096"),
        ("model.served_name", "\ud800", "broken Unicode"),
        ("model.path", "/models/m\nvllm-offload: switched", "control character"),
        ("model.path", "/models/m\x1b[2J", "control character"),
        ("kv_offload.cpu_tier_gib", float("nan"), "finite"),
        ("weights_offload.cpu_gib", float("inf"), "finite"),
    ],
)
def test_values_a_file_cannot_hold_are_refused(key: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_mod.with_overrides(DeploymentConfig(), {key: value})
    assert info.value.field == key and words in info.value.message


def test_save_keeps_the_files_owner_and_mode(tmp_path: Path) -> None:
    """Issue #15: the first save from the manager made config.toml 0600 and the manager
    user's, so a server running as another user could not read it at its next start."""
    path = tmp_path / "config.toml"
    config_mod.save(DeploymentConfig(), path)
    path.chmod(0o640)
    if os.getuid() == 0:
        os.chown(path, 12345, 23456)  # the server user's file
    config_mod.save(config_mod.with_overrides(DeploymentConfig(), {"server.port": 9}), path)
    stat = path.stat()
    assert stat.st_mode & 0o777 == 0o640
    if os.getuid() == 0:
        assert (stat.st_uid, stat.st_gid) == (12345, 23456)


def test_a_backup_that_cannot_be_written_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #15: on a full disk the .bak was truncated in place."""
    import errno
    import shutil

    path = tmp_path / "config.toml"
    config_mod.save(DeploymentConfig(), path)
    config_mod.save(config_mod.with_overrides(DeploymentConfig(), {"server.port": 9}), path)
    backup = path.with_suffix(".toml.bak")
    old_backup, current = backup.read_bytes(), path.read_bytes()

    def full_disk(source: Path, target: Path) -> None:
        Path(target).write_bytes(Path(source).read_bytes()[:10])  # a partial copy
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copy2", full_disk)
    with pytest.raises(OSError):
        config_mod.save(config_mod.with_overrides(DeploymentConfig(), {"server.port": 10}), path)
    assert backup.read_bytes() == old_backup and path.read_bytes() == current
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml", "config.toml.bak"]


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("--kv-offload-cpu-tier-gib", "kv_offload.cpu_tier_gib"),
        ("--kv-offload-disk-gib", "kv_offload.disk_gib"),
        ("--kv-offload-host-extension-gib", "kv_offload.host_extension_gib"),
        ("--weights-offload-cpu-gib", "weights_offload.cpu_gib"),
        ("--gpu-mem-gib", "--gpu-mem-gib"),
        ("--ram-gib", "--ram-gib"),
    ],
)
def test_sizes_past_any_machine_exit_2_naming_the_field(
    demo_dir: Path, flag: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #29: 1e308 GiB overflowed the planner's arithmetic (a traceback, exit 1; a
    500 from the manager)."""
    from vllm_offload.cli import main

    declared = [] if flag == "--gpu-mem-gib" else ["--gpu-mem-gib", "24"]
    assert main(["plan", "--model", str(demo_dir), *declared, flag, "1e308"]) == 2
    assert f"error: {field}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model.max_model_len", 10**30),
        ("gpu.kv_cache_memory_bytes", 10**30),
        ("model.served_name", "--trust-remote-code.x"),
        ("model.served_name", "-m"),
        ("model.served_name", "a b"),
        ("weights_offload.params", ["--model"]),
        ("weights_offload.params", ["visual", "-x"]),
        ("server.host", "--host"),
        ("server.host", "a b"),
        ("server.host", "-localhost"),
        ("model.path", "-m"),
    ],
)
def test_values_that_would_reach_vllm_as_options_are_refused(key: str, value: object) -> None:
    """Issue #29: a served name, a parameter name or a host that starts with '-' became an
    option of vLLM's (one with a '.' took the next token as its value)."""
    with pytest.raises(ConfigError) as info:
        config_mod.with_overrides(DeploymentConfig(), {key: value})
    assert info.value.field == key


def test_real_names_and_addresses_are_accepted() -> None:
    config = config_mod.with_overrides(
        DeploymentConfig(),
        {
            "model.served_name": "meta-llama/Llama-3.1-8B-Instruct:v2@main+fp8",
            "weights_offload.params": ["visual", "audio_tower", "model.layers.0", "_x"],
            "server.host": "fe80::1%eth0",
            "model.max_model_len": 10_485_760,
        },
    )
    assert config.weights_offload.params[2] == "model.layers.0"
    for host in ("0.0.0.0", "::", "localhost", "gpu-box.lan", "127.0.0.1", ""):
        config_mod.with_overrides(config, {"server.host": host})
