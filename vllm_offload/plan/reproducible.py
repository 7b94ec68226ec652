"""Whether vLLM chooses kernels by rule or by timing them at start-up (issue #54).

At a cold start vLLM 0.32/0.33 on CUDA times some kernel variants and keeps the fastest:
Inductor benchmarks its combo kernels and reduction configs, vLLM's Triton autotuners
their configs, FlashInfer its tactics. Variants that sum in another order round
differently: on an H200 (vLLM 0.33.0, an 8B shape, 12 cold starts) the fused residual
add + RMSNorm kernel took a block of 4,096 or of 2,048 by timing (4 starts of 12), and
every answer followed that choice, all-GPU or staged alike (the compile cache keeps a
start's winners, so warm starts repeated it: benchmarks/results/h200-vllm-0.33.0/
exactness/). With ``server.reproducible`` the launcher pins each choice to a rule instead:
Inductor's deterministic mode in the config vLLM patches into its compiles
(``launch.DETERMINISTIC_INDUCTOR``; one config per reduction), ``launch.REPRODUCIBLE_ENV``
and ``--no-enable-flashinfer-autotune``. vLLM's CPU platform times nothing (no combo
kernels, C++ kernels), so there it changes nothing.
"""

from __future__ import annotations

from vllm_offload.plan.records import Notes, PlanInputs


def kernel_choice(inputs: PlanInputs) -> tuple[bool, Notes]:
    """Whether the launcher pins vLLM's kernel choices, and the decision that says so."""
    config, platform = inputs.config, inputs.platform
    if platform != "cuda":
        return False, Notes()
    if config.server.reproducible:
        return True, Notes(
            decisions=(
                "server.reproducible: kernels chosen by rule, not by timing at start-up "
                "(Inductor's deterministic mode, the first config of vLLM's Triton "
                "autotuners, no FlashInfer autotuning): the same greedy answer after "
                "every start",
            )
        )
    return False, Notes(
        decisions=(
            "server.reproducible = false: vLLM times kernel variants at a cold start and "
            "keeps the fastest; an answer can move by one rounding step between cold starts",
        )
    )
