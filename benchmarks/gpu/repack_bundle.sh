#!/bin/bash
# make_bundle.sh's parts packed again tighter, as four: a call carries 64 MiB with the
# tree, and make_bundle's 55 MB parts (xz -6, 155.8 MB for 0.33.0) do not fit beside it.
# Files sorted by suffix (like beside like) and xz -9e with a 256 MiB dictionary make
# 140.5 MB; as three parts of 46.8 MB they left less than 1 MB beside the 19.1 MB tree and
# a base tree (twenty-second session), so four of 35.1 MB. ~5 min on two cores; the host
# unpacks it as before (host_setup.sh), needing 256 MiB to decompress.
# repack_bundle.sh DIR   (DIR/part_* replaced; the files unpacked are the same, checked)
set -euo pipefail
dir=${1:?usage: repack_bundle.sh DIR}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir "$work/u" "$work/v"
cat "$dir"/part_* | tar -C "$work/u" -xJf -
(cd "$work/u" && find . -type f -o -type l) \
  | awk -F/ '{e=$NF; sub(/^[^.]*/, "", e); print e "\t" $0}' | sort | cut -f2 > "$work/list"
tar -C "$work/u" --no-recursion -T "$work/list" -cf - \
  | xz --lzma2=preset=9e,dict=256MiB -T2 > "$work/b.tar.xz"
tar -C "$work/v" -xJf "$work/b.tar.xz" && diff -r --no-dereference "$work/u" "$work/v"
rm -f "$dir"/part_* && split -n 4 "$work/b.tar.xz" "$dir/part_" && ls -l "$dir"
