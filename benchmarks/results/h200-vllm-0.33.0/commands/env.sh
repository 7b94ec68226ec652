# sourced by each call after the unpack: the bundle, this tree, the plugin's dist-info
export PYTHONPATH=/root/vo:$PWD:/root/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export PATH=/root/vo/bin:$PATH
