"""Unified diffs as `diff -u`, difflib and git write them (a/ b/ prefixes; git's extended
header lines and a format-patch signature are skipped): parsed into hunks, and applied to
a text forwards or backwards."""

from __future__ import annotations

from dataclasses import dataclass


class DiffMismatch(ValueError):
    """A hunk does not match the text it is applied to."""


@dataclass(frozen=True, kw_only=True)
class Hunk:
    old_start: int
    old_lines: tuple[str, ...]  # context and removed lines, in order
    new_lines: tuple[str, ...]  # context and added lines, in order


@dataclass(frozen=True, kw_only=True)
class FilePatch:
    path: str  # relative to site-packages, e.g. vllm/v1/core/kv_cache_utils.py
    is_new: bool
    hunks: tuple[Hunk, ...]


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
            hunks.append(Hunk(old_start=old_start, old_lines=tuple(old), new_lines=tuple(new)))
        files.append(FilePatch(path=path, is_new=old_name == "/dev/null", hunks=tuple(hunks)))
    return files


def apply_hunks(text: str, hunks: tuple[Hunk, ...], reverse: bool) -> str:
    """``text`` with ``hunks`` applied (``reverse``: undone); DiffMismatch where they do not
    match it."""
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
            raise DiffMismatch(f"the patch does not match the file near line {start + 1}")
        out.extend(lines[cursor:start])
        out.extend(put)
        cursor = start + len(want)
        offset += len(hunk.new_lines) - len(hunk.old_lines)
    out.extend(lines[cursor:])
    return "".join(out)
