#!/bin/bash
# vLLM 0.33.0 + fused-MoE kernels (4 parts in /root/stage) -> /root/site; the plugin's
# dist-info in /root/vo (so vLLM loads vllm_offload's plugin); this tree's patches applied.
set -u; t0=$SECONDS; repo=$PWD
ls -l /root/stage
cd /root/stage && cat part_aa part_ab part_ac part_ad | xz -dc -T0 | (mkdir -p /root/site && tar -C /root/site -xf -) || { echo "UNPACK FAILED"; exit 1; }
info=/root/vo/vllm_offload-0.1.0.dist-info; mkdir -p $info /root/vo/bin
printf 'Metadata-Version: 2.1\nName: vllm-offload\nVersion: 0.1.0\n' > $info/METADATA
printf '[vllm.general_plugins]\nvllm_offload = vllm_offload.vllm_ext.plugin:register\n' > $info/entry_points.txt
printf '#!/bin/bash\nexec python3 -m vllm_offload "$@"\n' > /root/vo/bin/vllm-offload; chmod +x /root/vo/bin/vllm-offload
cd $repo; source .gpu/fork/sh/env.sh
echo "unpacked in $((SECONDS-t0)) s"; ls /root/site/vllm/_moe_C_stable_libtorch.abi3.so
python3 -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)' 2>&1 | tail -1
python3 -m vllm_offload patch apply --site /root/site > $OUT/patch.txt 2>&1; echo "patch rc=$?"; tail -3 $OUT/patch.txt
