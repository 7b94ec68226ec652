#!/usr/bin/env python3
"""Move a patch series between vllm_offload/patches/vllm-X.Y.Z/ and a vLLM git tree, so
that porting the series to a new vLLM release is `git am -3` and conflict resolution,
not editing diffs by hand (`make patches-import` / `make patches-export`):

  patch_series.py import --tree ~/vllm --series vllm_offload/patches/vllm-0.32.0
      git am -3 the series onto the tree's checked-out branch (e.g. a branch made at the
      new release's tag); resolve conflicts with git, as for any rebase.
  patch_series.py export --tree ~/vllm --base v0.33.0 --out vllm_offload/patches/vllm-0.33.0
      write BASE..HEAD of the tree as the series: one `git format-patch` file a commit
      (its subject and message are the patch's subject and reason), the `series` file,
      and `pristine.sha256` of the release files it changes ("-" for files it adds).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path


def git(tree: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(
        ["git", "-C", str(tree), *args], input=stdin, check=True, capture_output=True
    ).stdout


def export(tree: Path, base: str, out: Path) -> None:
    out = out.resolve()  # git runs in the tree
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.patch"):
        old.unlink()
    names = (
        git(
            tree,
            "format-patch",
            "--zero-commit",
            "--no-signature",
            "--no-numbered",
            "--full-index",
            "-o",
            str(out),
            f"{base}..HEAD",
        )
        .decode()
        .split()
    )
    (out / "series").write_text("".join(Path(name).name + "\n" for name in names))
    changed = git(tree, "diff", "--name-status", "--no-renames", f"{base}..HEAD").decode()
    lines = []
    for row in sorted(changed.splitlines(), key=lambda r: r.split("\t", 1)[1]):
        status, path = row.split("\t", 1)
        if status == "A":
            lines.append(f"-  {path}")
        else:
            digest = hashlib.sha256(git(tree, "show", f"{base}:{path}")).hexdigest()
            lines.append(f"{digest}  {path}")
    (out / "pristine.sha256").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(names)} patches to {out}")


def import_series(tree: Path, series: Path) -> None:
    series = series.resolve()  # git runs in the tree
    names = [n for n in (series / "series").read_text().split() if n]
    subprocess.run(
        ["git", "-C", str(tree), "am", "-3", *(str(series / n) for n in names)], check=True
    )
    print(f"applied {len(names)} patches onto {tree}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    to_tree = verbs.add_parser("import", help="git am -3 a series onto a vLLM git tree")
    to_tree.add_argument("--tree", type=Path, required=True)
    to_tree.add_argument("--series", type=Path, required=True)
    from_tree = verbs.add_parser("export", help="write BASE..HEAD of a vLLM tree as a series")
    from_tree.add_argument("--tree", type=Path, required=True)
    from_tree.add_argument("--base", required=True, help="the release's tag or commit")
    from_tree.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.verb == "import":
        import_series(args.tree, args.series)
    else:
        export(args.tree, args.base, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
