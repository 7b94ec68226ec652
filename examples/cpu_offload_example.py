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

from vllm_offload import hardware
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.hardware import HostFacts
from vllm_offload.model import facts as model_facts
from vllm_offload.plan import Plan, make_plan


def tier_plan(model: Path, cpu_tier_gib: str, host: HostFacts) -> Plan:
    """The planner's answer for this model with vLLM's native CPU tier on ``host``."""
    config = with_overrides(
        DeploymentConfig(),
        {
            "model.path": str(model),
            "kv_offload.backend": "native",
            "kv_offload.cpu_tier_gib": cpu_tier_gib,
        },
    )
    return make_plan(config, model_facts.read(model), host, "cuda")


def llm_options(plan: Plan) -> dict[str, object]:
    """What LLM(...) takes from the plan."""
    return {
        "max_model_len": plan.length.max_model_len,  # one request must fit the GPU pool
        "block_size": plan.kv.block_tokens,
        "kv_transfer_config": KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": plan.cpu_tier.bytes},
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--cpu-tier-gib", default="auto")
    args = parser.parse_args()
    plan = tier_plan(args.model, args.cpu_tier_gib, hardware.probe())
    llm = LLM(model=str(args.model), **llm_options(plan))
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
