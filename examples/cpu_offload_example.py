"""Offline inference with vLLM 0.32's CPU KV tier (OffloadingConnector), on an NVIDIA GPU.

The seed passed `num_cpu_blocks`, which vLLM 0.32 ignores: the tier is sized in
bytes with `cpu_bytes_to_use`. This example takes the size from the planner so
the same numbers as `vllm-offload serve` are used.

    python examples/cpu_offload_example.py --model /models/Meta-Llama-3.1-8B-Instruct
"""

import argparse
from pathlib import Path

from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig

from vllm_offload import hardware, model_facts
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.plan import make_plan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--cpu-tier-gib", default="auto")
    args = parser.parse_args()

    config = with_overrides(
        DeploymentConfig(),
        {
            "model.path": str(args.model),
            "kv_offload.backend": "native",
            "kv_offload.cpu_tier_gib": args.cpu_tier_gib,
        },
    )
    plan = make_plan(config, model_facts.read(args.model), hardware.probe(), "cuda")
    llm = LLM(
        model=str(args.model),
        max_model_len=plan.max_model_len,  # one request must fit the GPU pool
        block_size=plan.block_size_tokens,
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": plan.cpu_tier_bytes},
        ),
    )
    document = "The quick brown fox jumps over the lazy dog. " * 400
    prompts = [document + f"Question {i}: what did the fox do?" for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=32)
    # The second pass finds the shared document in the CPU tier once the GPU pool
    # has evicted it, instead of prefilling it again.
    for attempt in range(2):
        outputs = llm.generate(prompts, params)
        print(f"pass {attempt + 1}:", outputs[0].outputs[0].text[:80])


if __name__ == "__main__":
    main()
