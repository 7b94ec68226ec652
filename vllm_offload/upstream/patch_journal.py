"""Writing a patch series' files into a site-packages all or nothing: the originals are
copied into a journal (``vllm/.vllm_offload_journal``), only then are files replaced; an
exception rolls back from the journal, and a crash leaves it behind for ``recover``, which
the next patch command runs before anything else.

The site may be another user's: every write goes through ``site_files`` (no link followed,
temp files made with O_EXCL), and a replayed journal may name only the series' own files,
from backups that are regular files in the journal itself.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from vllm_offload.errors import VllmOffloadError
from vllm_offload.safe_files import read_regular
from vllm_offload.upstream import site_files

STATE_FILE = ".vllm_offload_patches.json"
JOURNAL_DIR = ".vllm_offload_journal"
MAX_FILE_BYTES = 64 * 1024 * 1024  # larger than any file of vLLM's the series touches
BACKUP_NAME = re.compile(r"[0-9]{1,6}\.orig")


class PatchError(VllmOffloadError):
    """The patches cannot be applied or reverted here; the text says why and what to do."""

    kind = "environment"


def replace_file(site: Path, rel: str, data: bytes | None) -> None:
    """Write or delete ``site / rel`` atomically, never through a link (site_files)."""
    try:
        site_files.replace_file(site, rel, data)
    except ValueError as exc:
        raise PatchError(f"{site}: {exc}; refusing to write there") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PatchError(
                f"{site / rel}: a link on the way; refusing to write through it"
            ) from None
        raise


def _open_journal(site: Path, *, create: bool) -> int | None:
    """The journal folder's fd (made empty first if ``create``); None if there is none.
    A link there is refused."""
    vllm = site_files.open_folder(site, ("vllm",), create=False)
    try:
        if create:
            os.mkdir(JOURNAL_DIR, 0o755, dir_fd=vllm)
        return os.open(
            JOURNAL_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=vllm
        )
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PatchError(
                f"{site / 'vllm' / JOURNAL_DIR}: not vllm-offload's journal (a "
                "link or a file); check it, then remove it"
            ) from None
        raise
    finally:
        os.close(vllm)


def _begin_journal(site: Path, targets: list[str]) -> None:
    journal = _open_journal(site, create=True)
    assert journal is not None
    try:
        originals: dict[str, str | None] = {}
        for n, rel in enumerate(targets):
            data = read_file(site / rel)
            originals[rel] = None if data is None else f"{n}.orig"
            if data is not None:
                site_files.write_new(journal, f"{n}.orig", data)
        site_files.write_new(journal, "manifest.json", json.dumps(originals).encode())
    finally:
        os.close(journal)


def _remove_journal(site: Path) -> None:
    vllm = site_files.open_folder(site, ("vllm",), create=False)
    try:
        shutil.rmtree(JOURNAL_DIR, dir_fd=vllm)  # never follows a link inside it
    finally:
        os.close(vllm)


def _journal_entries(site: Path, journal: int, targets: set[str]) -> list[tuple[str, bytes | None]]:
    """(file, its original bytes or None) for each file the journal names: only the
    series' own files, from backups N.orig that are regular files in the journal."""
    where = site / "vllm" / JOURNAL_DIR
    try:
        manifest = read_regular("manifest.json", MAX_FILE_BYTES, follow_links=False, dir_fd=journal)
    except FileNotFoundError:
        return []  # cut off before its manifest: nothing was replaced yet
    try:
        entries = [(str(rel), backup) for rel, backup in json.loads(manifest).items()]
    except (ValueError, AttributeError):
        raise PatchError(f"{where}: a garbled journal; check it, then remove it") from None
    replay: list[tuple[str, bytes | None]] = []
    for rel, backup in entries:
        if rel not in targets or not (backup is None or BACKUP_NAME.fullmatch(str(backup))):
            raise PatchError(
                f"{where}: names {rel!r}, not a file of vllm-offload's series; "
                "not replayed (check and remove it)"
            )
        original = None
        if backup is not None:
            original = read_regular(str(backup), MAX_FILE_BYTES, follow_links=False, dir_fd=journal)
        replay.append((rel, original))
    return replay


def recover(site: Path, series_files: Callable[[], set[str]]) -> bool:
    """Roll back an apply/revert that was cut off; True if there was one. ``series_files``:
    the files the installed release's series may write (read only when a journal is
    there)."""
    journal = _open_journal(site, create=False)
    if journal is None:
        return False
    try:
        replay = _journal_entries(site, journal, series_files())
    finally:
        os.close(journal)
    for rel, original in replay:
        replace_file(site, rel, original)
    _remove_journal(site)
    return True


def write_all(site: Path, contents: Mapping[str, bytes | None], state: bytes | None) -> None:
    """Write (bytes) or remove (None) each file of ``contents``, then the state file (None:
    removed), all or nothing."""
    _begin_journal(site, list(contents))
    try:
        for rel, data in contents.items():
            replace_file(site, rel, data)
        replace_file(site, f"vllm/{STATE_FILE}", state)
    except BaseException:
        recover(site, lambda: set(contents))
        raise
    _remove_journal(site)


def read_file(path: Path) -> bytes | None:
    """A file's bytes (None where it is absent); only a regular file is read."""
    try:
        return read_regular(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PatchError(f"{path}: cannot read it ({exc})") from None
