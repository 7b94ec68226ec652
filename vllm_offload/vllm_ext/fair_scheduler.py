"""vLLM's scheduler with ``spill_share``'s rules for a pool with a host extension (issue
#42), loaded by ``--scheduler-cls`` (the launcher passes it with a host extension only).

Long requests (past half the GPU part, from their first chunk) share the GPU's time: a
step that keeps them out hides them from vLLM's running list while vLLM schedules it and
has vLLM skip those in its waiting line (their places in the running limit kept); vLLM's
own loop, budgets and preemption decide the rest. Their blocks come from the GPU up to
half of it, then from host RAM (``gpu_part``, below 1 only). Short prompts waiting with a
new long one go first; a long chunk beside others is bounded
(``SpillShare.long_chunk_tokens``) and launched with no step in flight
(``_hands_over_first``). A share of 1 leaves patch 0006's host blocks alone.
Runs inside vLLM's engine core; imports vLLM (0.32.0 and 0.33.0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.request import Request, RequestStatus

from vllm_offload.vllm_ext import knobs, spill_share
from vllm_offload.vllm_ext.gpu_part import GpuPartScheduler
from vllm_offload.vllm_ext.knobs import SPILLED_STEP_SHARE_KEY

logger = init_logger("vllm.vllm_offload.fair_scheduler")  # printed as vLLM's own
# Waiting requests a step could run: not those waiting for a grammar, remote KV or the
# next part of a streamed request, beside which the share would only leave the GPU idle.
READY_TO_RUN = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def _all_new(prefills: list[Request]) -> bool:
    """Whether each of the long requests that may prefill takes its first chunk: none
    computed, none preempted (a prefix-cache hit is seen only as vLLM schedules it: such
    a chunk is sized as a first one, and measured as what it is)."""
    return bool(prefills) and all(
        r.num_computed_tokens == 0 and r.num_preemptions == 0 for r in prefills
    )


class FairScheduler(GpuPartScheduler):
    """vLLM's Scheduler, or its AsyncScheduler where vLLM turned async scheduling on."""

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> FairScheduler:
        chosen = FairAsyncScheduler if vllm_config.scheduler_config.async_scheduling else cls
        return super().__new__(chosen)

    def __init__(self, vllm_config: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        # Not given (the launcher always gives it): no time limit, GPU blocks first.
        share = knobs.additional(vllm_config, SPILLED_STEP_SHARE_KEY, 1.0)
        self.spill_share = spill_share.SpillShare(share=spill_share.read_share(share))
        # A step left empty for a long request's prefill that has not had a step since.
        self.emptied_for_long = False
        # The long requests in the waiting line whose place there is settled.
        self.placed_longs: set[str] = set()
        # While vLLM schedules a step: the share keeps the waiting long requests out.
        self.holding_back_longs = False
        self.sharing = bool(self.host_blocks) and self.spill_share.share < 1  # 1: 0006 alone
        if self.sharing:
            self.keep_requests_to_their_parts()

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if not self.host_blocks:
            return super().schedule(*args, **kwargs)  # no host blocks: nothing to share
        self.long_running = [r for r in self.running if self.is_long(r)]
        # A long request's first chunks may fit the GPU blocks left of its half: counted
        # only once it held a host block, they spaced nothing (issue #54, fair4: two long
        # gaps in every chat that came before it).
        waiting = [r for line in (self.waiting, self.kv_holding_waiting) for r in line]
        ready = [r for r in waiting if r.status in READY_TO_RUN]
        others = any(not self.is_long(r) for r in [*self.running, *ready])
        longs_ready = [r for r in ready if self.is_long(r)]
        # A long request and others, running or ready: the share is in force, for a long
        # request that waits for its first chunk too.
        met = others and bool(self.long_running or longs_ready)
        if not self.long_running and not any(self.is_long(r) for r in waiting):
            self.spill_share.start_over()  # none left (ended, aborted): the next waits anew
        if self.sharing:
            self._short_prompts_first()
        admit = not self.sharing or self.spill_share.admit(others=met)
        prefilling = self._long_prefills(admit, longs_ready) if others and self.sharing else []
        if not prefilling:  # one that prefills later gets its own empty step; one the
            # share holds back keeps the one it had (found in review: one before each)
            self.emptied_for_long = self.emptied_for_long and not admit
        elif self._hands_over_first():
            return self._empty_step(*args, **kwargs)
        with self._prefill_chunks_of(self._long_chunk(len(prefilling), _all_new(prefilling))):
            output = self._schedule_without(
                *(([], []) if admit else (self.long_running, longs_ready)), *args, **kwargs
            )
        scheduled = output.num_scheduled_tokens
        longs = {i: n for i, n in scheduled.items() if self._is_long_id(i)}
        long_tokens = sum(longs.values())
        shared = met or (others and long_tokens > 0)
        if any(r.request_id in scheduled for r in prefilling):
            self.emptied_for_long = False
        if output.total_num_scheduled_tokens:  # an empty step keeps none waiting
            self.spill_share.started(
                output,
                spilled=long_tokens > 0,
                shared=shared,
                beside=others,
                long_tokens=long_tokens,
                # vLLM counted the step's tokens as computed as it scheduled them: a chunk
                # that began at 0 is a first one (not one after a prefix-cache hit)
                first_chunk=bool(longs)
                and all(self.requests[i].num_computed_tokens == n for i, n in longs.items()),
            )
        return output

    def _short_prompts_first(self) -> None:
        """A long request new in the waiting line goes behind the short ones waiting
        there with it, once, so that a long prompt arriving among chats takes what their
        prompts leave of the step, not the step they would have had (issue #54, fair9's
        'with': the chats queued behind it prefilled one step later, and those ahead of
        it saw that prefill step as a 34-45 ms gap). Once: chats arriving later queue
        behind it, so that it is not starved; a preempted one keeps the front, where vLLM
        puts it; with vLLM's priority policy the line keeps its own order."""
        if self.policy != SchedulingPolicy.FCFS:
            return
        line = list(self.waiting)
        self.placed_longs &= {r.request_id for r in line}  # those still waiting
        last_short = max((n for n, r in enumerate(line) if not self.is_long(r)), default=0)
        moved = [
            r
            for r in line[:last_short]
            if self.is_long(r)
            and r.status == RequestStatus.WAITING
            and r.request_id not in self.placed_longs
        ]
        if moved:
            self.waiting.remove_requests(moved)
            for request in moved:
                self.waiting.add_request(request)
        # placed once seen, moved or not: the share may hold one back while chats arrive
        # behind it (found in review)
        self.placed_longs |= {r.request_id for r in line if self.is_long(r)}

    def _long_prefills(self, admit: bool, longs_ready: list[Request]) -> list[Request]:
        """The long requests that may prefill in this step where the share admits them:
        those running, and those ready in the waiting line (a first chunk) while vLLM
        admits more; not one that only decodes (found in review: chats' prompts were
        split for a long request's whole life)."""
        if not admit:
            return []
        prefilling = [r for r in self.long_running if r.num_computed_tokens < r.num_prompt_tokens]
        if len(self.running) < self.max_num_active_reqs:  # vLLM's own limit, both versions
            prefilling += longs_ready
        return prefilling

    def _long_chunk(self, prefills: int, first: bool) -> int:
        """The tokens each long prompt may take in a step where ``prefills`` long
        requests may prefill beside others (``first``: each its first chunk; 0: as
        configured)."""
        if not prefills or not self.scheduler_config.enable_chunked_prefill:
            return 0  # vLLM would chunk prompts it may not split
        return self.spill_share.long_chunk_tokens(self.block_size, prefills, first)

    def _hands_over_first(self) -> bool:
        """Whether this step is left empty, so that vLLM hands the step in flight over
        before a long request's prefill is launched: vLLM's engine (async scheduling)
        hands a step's output over only after launching the next step, and launching a
        long chunk takes tens of ms of CPU (issue #54, fair9 on an H100: ~35 ms for
        8,192 tokens), which every token of the step before it waited out: a second long
        gap for each chat beside the chunk's own. Once until a long request prefills or
        none may: if it does not get in after all, the next steps run as they would (one
        the share then holds back may be launched over a step in flight when it gets in)."""
        if self.emptied_for_long or not self.spill_share.in_flight():
            return False
        self.emptied_for_long = True
        return True

    def _empty_step(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        """vLLM's own step with nothing scheduled (its bookkeeping done, as when it is
        paused): its engine then waits for the step in flight and hands it over."""
        budget, bound = self.max_num_scheduled_tokens, self.prefill_capacity_bound
        self.max_num_scheduled_tokens = 0
        try:
            return super().schedule(*args, **kwargs)
        finally:  # the waiting line's "capacity bound" of a step that admitted none: not
            self.max_num_scheduled_tokens, self.prefill_capacity_bound = budget, bound

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        """vLLM's check of a waiting request before it schedules it; a long one the share
        holds back is skipped too (vLLM keeps its place in the line and counts it among
        the deferred, as one waiting for a grammar)."""
        ready = bool(super()._handle_blocked_waiting_request(request))  # vLLM's first
        return ready and not (self.holding_back_longs and self.is_long(request))

    @contextlib.contextmanager
    def _prefill_chunks_of(self, tokens: int) -> Iterator[None]:
        """vLLM's ``long_prefill_token_threshold`` at most ``tokens`` (0: as configured)
        while it schedules a step: every prompt's chunk in it, a long request's first."""
        config = self.scheduler_config
        configured = config.long_prefill_token_threshold
        if tokens:
            config.long_prefill_token_threshold = min(configured or tokens, tokens)
        try:
            yield
        finally:
            config.long_prefill_token_threshold = configured

    def update_from_output(
        self, scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any
    ) -> Any:
        self.spill_share.ended(scheduler_output)  # the step's length, host reads included
        outputs = super().update_from_output(scheduler_output, *args, **kwargs)
        ended = [r for r in self.long_running if r.is_finished()]
        if ended:
            self.long_running = [r for r in self.long_running if not r.is_finished()]
            self._log_share()
        return outputs

    def _log_share(self) -> None:
        """What the share gave so far, when a long request ends (the GPU benchmark reads
        it: benchmarks/gpu/fairness.py)."""
        share = self.spill_share
        logger.info(
            "long request ended; spilled steps took %.3f s (at least %.3f s) of %.3f s of "
            "steps beside others so far (kv_spilled_step_share %.2f)",
            share.spilled_shared_s,
            share.spilled_shared_low_s,
            share.shared_s,
            share.share,
        )

    def _schedule_without(
        self, hidden: list[Request], held: list[Request], *args: Any, **kwargs: Any
    ) -> SchedulerOutput:
        """vLLM's step without the long requests the share keeps out: ``hidden`` running
        ones out of its running list, ``held`` waiting ones skipped in their places; the
        running limits lowered by both (by the free places the held ones would take), so
        that no other request takes their places (found in review: a chat behind a held
        one took the place it would have had, and it waited 12-20 s for its first
        chunk)."""
        if not hidden and not held:
            return super().schedule(*args, **kwargs)
        before = list(self.running)
        hidden_ids = {id(r) for r in hidden}
        self.running = [r for r in before if id(r) not in hidden_ids]
        free = max(0, self.max_num_running_reqs - len(before))  # vLLM asserts the limit
        kept_out = len(hidden) + min(len(held), free)
        self.max_num_running_reqs -= kept_out
        self.max_num_active_reqs -= kept_out
        self.holding_back_longs = bool(held)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.holding_back_longs = False
            self.max_num_running_reqs += kept_out
            self.max_num_active_reqs += kept_out
            after = {id(r) for r in self.running}
            kept = [r for r in before if id(r) in hidden_ids or id(r) in after]
            known = {id(r) for r in before}
            self.running = kept + [r for r in self.running if id(r) not in known]


class FairAsyncScheduler(FairScheduler, AsyncScheduler):
    """FairScheduler over vLLM's AsyncScheduler (FairScheduler.__new__ picks it)."""
