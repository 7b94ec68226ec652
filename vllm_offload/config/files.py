"""The config file: read, written atomically (read back before the rename, owner and mode
kept, a backup beside it), and its TOML."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from vllm_offload.config.schema import ConfigError, DeploymentConfig, parse
from vllm_offload.safe_files import read_regular

DEFAULT_CONFIG_PATH = Path("/etc/vllm-offload/config.toml")
MAX_CONFIG_BYTES = 1 << 20


def load(path: Path) -> DeploymentConfig:
    try:  # a regular file of reasonable size: a FIFO here would hang every reader
        text = read_regular(path, MAX_CONFIG_BYTES).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read the config file: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from None
    return parse(data)


def user_config_path() -> Path:
    """The config of a user running things by hand: $XDG_CONFIG_HOME (or ~/.config)
    /vllm-offload/config.toml, what `vllm-offload manager` edits where the system has none."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "vllm-offload" / "config.toml"


def default_path() -> Path | None:
    """The config commands read without --config: the system's, else the user's, where
    it exists (else None: built-in defaults)."""
    for path in (DEFAULT_CONFIG_PATH, user_config_path()):
        if path.is_file():
            return path
    return None


def load_default(path: Path | None) -> tuple[DeploymentConfig, Path | None]:
    """The config at ``path``; else the system's, else the user's (default_path); else
    built-in defaults."""
    path = path if path is not None else default_path()
    if path is not None:
        return load(path), path
    return DeploymentConfig(), None


_TOML_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    **{chr(c): f"\\u{c:04x}" for c in [*range(0x20), 0x7F]},
}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # A TOML basic string: backslash, quote and every control character escaped (a
        # newline in a value must not end the line and break the file).
        return '"' + "".join(_TOML_ESCAPES.get(c) or c for c in value) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table ([[cluster.boxes]] entries, model_urls)
        pairs = (f"{_toml_value(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(pairs) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def to_toml(config: DeploymentConfig) -> str:
    data = config.model_dump(exclude_none=True)
    lines = [f"extra_args = {_toml_value(data.pop('extra_args'))}"]
    models = data.pop("models")
    if models:  # several models: [model] stays at its defaults, unwritten
        data.pop("model")
    for section, values in data.items():
        lines.append(f"\n[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
    for entry in models:
        lines.append("\n[[models]]")
        tables = {k: v for k, v in entry.items() if isinstance(v, dict)}
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in entry.items() if k not in tables)
        for table, values in tables.items():
            if values:  # [models.kv_offload] belongs to the [[models]] entry above it
                lines.append(f"[models.{table}]")
                lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
    return "\n".join(lines) + "\n"


def file_tag(path: Path) -> str:
    """An ETag of the file as it is now (its bytes' hash); '' when there is none."""
    try:
        return '"' + hashlib.sha256(read_regular(path, MAX_CONFIG_BYTES)).hexdigest()[:32] + '"'
    except OSError:
        return ""


def sweep_temp_files(path: Path) -> None:
    """Remove temp files a killed ``save`` left beside ``path``."""
    for leftover in path.parent.glob(f".{path.name}.*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


def save(config: DeploymentConfig, path: Path) -> None:
    """Write atomically: a temp file in the same directory, fsync, rename; keep ``.bak``.
    The text is read back before the rename (what is saved always loads), and the file
    keeps its owner and mode (a server running as another user must still read it)."""
    text = to_toml(config)
    if parse(tomllib.loads(text)) != config:
        raise ConfigError(str(path), "the config did not survive writing it as TOML; not saved")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            old = os.stat(path) if path.exists() else None
            os.fchmod(f.fileno(), old.st_mode & 0o7777 if old else 0o644)
            if old is not None and (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
                with contextlib.suppress(PermissionError):  # only root may give files away
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
        if path.exists():  # the backup is replaced whole too: a full disk keeps the old one
            backup_tmp = path.with_name(f".{path.name}.bak-tmp")
            shutil.copy2(path, backup_tmp)
            os.replace(backup_tmp, path.with_suffix(path.suffix + ".bak"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        path.with_name(f".{path.name}.bak-tmp").unlink(missing_ok=True)
        raise
