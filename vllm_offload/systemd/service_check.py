"""Before install-service writes anything: can the units' users open what the units
point at? The interpreter (ExecStart names it: the venv's python, often a link into a
pyenv under root's home), the packages it imports (vllm_offload and vLLM), the config,
the model folders and the disk tier's parent. Each refusal names the user and the path
it cannot pass; the dry run lists them instead of stopping at the first."""

from __future__ import annotations

import os
import pwd
import subprocess
from contextlib import suppress
from pathlib import Path

from vllm_offload import config as config_mod
from vllm_offload.model import hub
from vllm_offload.systemd import access
from vllm_offload.systemd.access import EXECUTE, READ, Who
from vllm_offload.systemd.unit_files import InstallError, InstallOptions, config_of

# Prints where the interpreter finds the packages the units import, importing neither.
_FIND_PACKAGES = (
    "import importlib.util as u\n"
    "for name in ('vllm_offload', 'vllm'):\n"
    "    spec = u.find_spec(name)\n"
    "    print(spec.submodule_search_locations[0] if spec else '')\n"
)


def users_missing(options: InstallOptions) -> list[InstallError]:
    """An InstallError for each of --user and --manager-user that is not on this host."""
    missing = []
    for option, name in (
        ("--user", options.user),
        ("--manager-user", options.manager_user or options.user),
    ):
        try:
            pwd.getpwnam(name)
        except KeyError:
            missing.append(
                InstallError(
                    f"{option} {name!r}: no such user on this host; create it (e.g. `useradd "
                    f"--system --home {options.state_dir} {name}`) or pass an existing one"
                )
            )
    if len(missing) == 2 and options.manager_user in ("", options.user):
        return missing[:1]
    return missing


def packages(python: str) -> list[Path]:
    """The folders of vllm_offload and vLLM that ``python`` imports."""
    try:
        found = subprocess.run(
            [python, "-I", "-c", _FIND_PACKAGES],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError) as exc:
        raise InstallError(
            f"--python {python}: cannot ask it where its packages are ({exc})"
        ) from None
    return [Path(line) for line in found if line]


def service_hf_cache(options: InstallOptions) -> str:
    """The HF cache the server unit reads hub ids from: HF_HUB_CACHE or HF_HOME as its
    environment file sets them, else the default under its HOME (the state directory)."""
    env: dict[str, str] = {}
    env_file = options.root / f"etc/default/{options.unit}-offload"
    with suppress(OSError):
        for line in env_file.read_text().splitlines():
            name, sep, value = line.strip().partition("=")
            if sep and not name.startswith("#"):
                env[name.strip()] = value.strip().strip("\"'")
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    return str(Path(env.get("HF_HOME") or options.state_dir / ".cache/huggingface") / "hub")


def model_folders(
    options: InstallOptions, config: config_mod.DeploymentConfig
) -> tuple[list[Path], list[InstallError]]:
    """The configured models' folders (a hub id's download in the server's HF cache; the
    demo model is written by the server itself), and a refusal for each hub id the server
    would not find downloaded (it never downloads on start)."""
    paths = [entry.path for entry in config.models] or [config.model.path]
    folders, missing = [], []
    for path in filter(None, paths):
        ref = hub.hub_ref(path)
        if ref is None:
            folders.append(Path(os.path.expanduser(path)))
        elif (
            folder := hub.cached(
                ref, str(options.root / (cache := service_hf_cache(options)).lstrip("/"))
            )
        ) is not None:
            folders.append(folder)
        else:
            missing.append(
                InstallError(
                    f"model.path {ref}: not downloaded where the server looks ({cache}); fetch it "
                    f"there as its user (sudo -u {options.user} HF_HUB_CACHE={cache} vllm-offload "
                    f"pull {ref}), or set HF_HOME in /etc/default/{options.unit}-offload"
                )
            )
    return folders, missing


def refusals(options: InstallOptions) -> list[InstallError]:
    """Every reason the units could not start as their users, each naming the path."""
    missing = users_missing(options)
    if missing:
        return missing
    config = config_of(options)
    reads = [(Path(options.python), EXECUTE, "the interpreter the units run (ExecStart)")]
    reads += [
        (folder, READ | EXECUTE, "a package the units import")
        for folder in packages(options.python)
    ]
    if options.config.is_file():
        reads.append((options.config, READ, "the config (--config)"))
    found_folders, found = model_folders(options, config)
    folders = [(folder, "model.path") for folder in found_folders]
    if config.kv_offload.disk_path:  # the tier's own folder is granted; its parents not
        reads.append(
            (Path(config.kv_offload.disk_path).parent, EXECUTE, "kv_offload.disk_path's parent")
        )
    for name in dict.fromkeys((options.user, options.manager_user or options.user)):
        who = Who.of(name)
        for path, want, what in reads:
            if (why := access.blocked(path, who, want)) is not None:
                found.append(InstallError(f"{what}: {why}; {_fix(path, name)}"))
        for folder, what in folders:
            if (why := access.blocked_folder(folder, who)) is not None:
                found.append(InstallError(f"{what} {folder}: {why}; {_fix(folder, name)}"))
    return found


def _fix(path: Path, user: str) -> str:
    return (
        f"let {user} reach it (chmod o+x on the folders on the way, o+r on the files, or "
        f"an ACL: setfacl -m u:{user}:rx, from the package 'acl'), or install from a clone "
        "and Python it can read (e.g. under /opt)"
    )
