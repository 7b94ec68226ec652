#!/bin/bash
# machine 2: unpack + patch, the real model converted (for paths.sh)
set -u; t0=$SECONDS
cp .gpu/needle/n_ae /root/stage/ && bash .gpu/fork/sh/unpack.sh > $OUT/unpack.txt 2>&1 || { cat $OUT/unpack.txt; exit 1; }
tail -4 $OUT/unpack.txt
source .gpu/fork/sh/env.sh
STAGE=/root/stage bash .gpu/needle/sh/convert.sh /root/smollm2 > $OUT/convert.txt 2>&1; echo "convert rc=$?"; tail -3 $OUT/convert.txt
echo "setup done in $((SECONDS-t0)) s"
