"""vLLM's scheduler with ``spill_share``'s rules for a pool with a host extension (issue
#42), loaded by ``--scheduler-cls`` (the launcher passes it with a host extension only).

A step whose spilled requests the time share keeps out hides them from vLLM's running
list while vLLM schedules it (and lowers the running limit by as many, so none is
admitted in their place), then puts them back in their order: vLLM's own loop, budgets
and preemption decide everything else. Allocations for a request that holds its most of
the GPU part take host blocks first (``DeviceFirstFreeBlockQueue.host_first``). Runs
inside vLLM's engine core; imports vLLM (0.32.0 and 0.33.0).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from vllm_offload.vllm_ext import spill_share
from vllm_offload.vllm_ext.knobs import SPILLED_STEP_SHARE_KEY
from vllm_offload.vllm_ext.kv_host_extension import DeviceFirstFreeBlockQueue


class FairScheduler(Scheduler):
    """vLLM's Scheduler, or its AsyncScheduler where vLLM turned async scheduling on."""

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> FairScheduler:
        chosen = FairAsyncScheduler if vllm_config.scheduler_config.async_scheduling else cls
        return super().__new__(chosen)

    def __init__(self, vllm_config: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        self.host_blocks = getattr(kv_cache_config, "num_host_blocks", 0)  # patch 0006
        self.first_host_block = kv_cache_config.num_blocks - self.host_blocks
        # Not given (the launcher always gives it): no time limit, host blocks last.
        additional = vllm_config.additional_config
        share = additional.get(SPILLED_STEP_SHARE_KEY, 1.0) if isinstance(additional, dict) else 1.0
        self.spill_share = spill_share.SpillShare(share=spill_share.read_share(share))
        if self.host_blocks and self.spill_share.share < 1:  # 1: patch 0006 alone
            self._allocate_host_first_past_half()

    def _allocate_host_first_past_half(self) -> None:
        queue = self.kv_cache_manager.block_pool.free_block_queue
        assert isinstance(queue, DeviceFirstFreeBlockQueue)  # patch 0006's, with host blocks
        allocate = self.kv_cache_manager.allocate_slots

        def allocate_slots(request: Request, *args: Any, **kwargs: Any) -> Any:
            # Count its blocks (every step) only if its length could fill half the part.
            at_most = -(-request.num_tokens_with_spec // self.block_size)
            long = spill_share.host_first(at_most, self.first_host_block)
            held = self._gpu_blocks_held(request) if long else 0
            queue.host_first = spill_share.host_first(held, self.first_host_block)
            try:
                return allocate(request, *args, **kwargs)
            finally:
                queue.host_first = False

        self.kv_cache_manager.allocate_slots = allocate_slots  # type: ignore[method-assign]

    def _block_ids(self, request: Request) -> list[int]:
        return [i for ids in self.kv_cache_manager.get_block_ids(request.request_id) for i in ids]

    def _gpu_blocks_held(self, request: Request) -> int:
        return sum(1 for i in self._block_ids(request) if i < self.first_host_block)

    def holds_host_blocks(self, request: Request) -> bool:
        return any(i >= self.first_host_block for i in self._block_ids(request))

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if not self.host_blocks:
            return super().schedule(*args, **kwargs)  # no host blocks: nothing to share
        spilled = [r for r in self.running if self.holds_host_blocks(r)]
        others = len(spilled) < len(self.running) or self.get_request_counts()[1] > 0
        hidden = [] if not spilled or self.spill_share.admit(others=others) else spilled
        output = self._schedule_without(hidden, *args, **kwargs)
        ran = (self.requests[i] for i in output.num_scheduled_tokens if i in self.requests)
        self.spill_share.started(output, spilled=any(self.holds_host_blocks(r) for r in ran))
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any
    ) -> Any:
        self.spill_share.ended(scheduler_output)  # the step's length, host reads included
        return super().update_from_output(scheduler_output, *args, **kwargs)

    def _schedule_without(
        self, hidden: list[Request], *args: Any, **kwargs: Any
    ) -> SchedulerOutput:
        if not hidden:
            return super().schedule(*args, **kwargs)
        before = list(self.running)
        hidden_ids = {id(r) for r in hidden}
        self.running = [r for r in before if id(r) not in hidden_ids]
        self.max_num_running_reqs -= len(hidden)
        self.max_num_active_reqs -= len(hidden)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_running_reqs += len(hidden)
            self.max_num_active_reqs += len(hidden)
            after = {id(r) for r in self.running}
            kept = [r for r in before if id(r) in hidden_ids or id(r) in after]
            known = {id(r) for r in before}
            self.running = kept + [r for r in self.running if id(r) not in known]


class FairAsyncScheduler(FairScheduler, AsyncScheduler):
    """FairScheduler over vLLM's AsyncScheduler (FairScheduler.__new__ picks it)."""
