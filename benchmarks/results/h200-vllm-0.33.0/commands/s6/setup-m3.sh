#!/bin/bash
set -u; t0=$SECONDS
bash .gpu/fork/sh/unpack.sh > $OUT/unpack.txt 2>&1 || { cat $OUT/unpack.txt; exit 1; }
tail -2 $OUT/unpack.txt; echo "setup done in $((SECONDS-t0)) s"
