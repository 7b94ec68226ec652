"""The GPU part of a pool with a host extension (patch 0006) kept to its users: long
requests (past half the GPU part, from their first chunk) take GPU blocks up to half of
it together (``DeviceFirstFreeBlockQueue.gpu_allowance``), then host ones; a short request
that would not find GPU blocks beside them and other short ones waits, as for a full
pool, rather than read host ones (with no other short one running it goes on, host
blocks if it must). ``fair_scheduler`` adds the time share on top (issues #42, #54).
Runs inside vLLM's engine core; imports vLLM (0.32.0 and 0.33.0).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from vllm_offload.vllm_ext import spill_share
from vllm_offload.vllm_ext.kv_host_extension import DeviceFirstFreeBlockQueue


class GpuPartScheduler(Scheduler):
    """vLLM's Scheduler that knows which of its blocks are the GPU's; with
    ``keep_requests_to_their_parts`` its allocations follow the rules above, once the
    subclass's ``schedule()`` keeps ``long_running`` (none running: no short request
    waits)."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        self.host_blocks = getattr(kv_cache_config, "num_host_blocks", 0)  # patch 0006
        self.first_host_block = kv_cache_config.num_blocks - self.host_blocks
        # The long requests running as this step began (kept by the subclass's schedule()).
        self.long_running: list[Request] = []

    def keep_requests_to_their_parts(self) -> None:
        queue = self.kv_cache_manager.block_pool.free_block_queue
        assert isinstance(queue, DeviceFirstFreeBlockQueue)  # patch 0006's, with host blocks
        allocate = self.kv_cache_manager.allocate_slots

        def allocate_slots(request: Request, *args: Any, **kwargs: Any) -> Any:
            if self.is_long(request):
                queue.gpu_allowance = self._long_allowance_left(request)
            elif self._waits_beside_long(request, queue.device.num_free_blocks):
                return None  # it waits, as for a full pool
            try:
                return allocate(request, *args, **kwargs)
            finally:
                queue.gpu_allowance = None

        self.kv_cache_manager.allocate_slots = allocate_slots  # type: ignore[method-assign]

    def is_long(self, request: Request) -> bool:
        """Whether its blocks past half the GPU part (with the other long requests') come
        from host RAM: a spilled request, or one that spills as its prefill goes on."""
        blocks = -(-request.num_tokens_with_spec // self.block_size)
        return spill_share.is_long(blocks, self.first_host_block)

    def _is_long_id(self, request_id: str) -> bool:
        return request_id in self.requests and self.is_long(self.requests[request_id])

    def _long_requests(self, request: Request) -> list[Request]:
        """The long requests holding blocks now: those running (one admitted earlier in
        this step is running already; found in review, two admitted in one step held a
        half each), those the share hides from this step, and ``request``."""
        found = {id(r): r for r in [*self.running, *self.long_running, request] if self.is_long(r)}
        return list(found.values())

    def _long_allowance_left(self, request: Request) -> int:
        """The GPU blocks the long requests (``request`` among them if it is one) may
        still take of their half."""
        held = sum(self._gpu_blocks_held(r) for r in self._long_requests(request))
        return spill_share.gpu_allowance(held, self.first_host_block)

    def _block_ids(self, request: Request) -> list[int]:
        return [i for ids in self.kv_cache_manager.get_block_ids(request.request_id) for i in ids]

    def _gpu_blocks_held(self, request: Request) -> int:
        return sum(1 for i in self._block_ids(request) if i < self.first_host_block)

    def _still_to_hold(self, request: Request) -> int:
        """The blocks a short request is expected to take beyond those it holds."""
        expected = spill_share.expected_blocks(
            request.num_prompt_tokens, request.max_tokens, self.block_size
        )
        return max(0, expected - len(self._block_ids(request)))

    def _waits_beside_long(self, request: Request, free_gpu_blocks: int) -> bool:
        """Whether a short request not yet running waits for GPU blocks: a long request
        runs, other short ones do, and what they are promised and it expects to hold do
        not fit the free GPU blocks less those the long requests may still take (one
        mid-prefill takes the rest of its half with its next chunks)."""
        if not self.long_running or request.status == RequestStatus.RUNNING:
            return False
        shorts = [r for r in self.running if not self.is_long(r)]
        if not shorts:
            return False  # none to keep apart from: it goes on, host blocks if it must
        theirs = self._long_allowance_left(request)
        promised = sum(self._still_to_hold(r) for r in shorts)
        return promised + self._still_to_hold(request) > free_gpu_blocks - theirs
