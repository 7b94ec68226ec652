# sourced by each call: the unpacked bundle, our branch's tree, the plugin's dist-info
export PYTHONPATH=/root/vo:/root/src:/root/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
export PATH=/root/vo/bin:$PATH
