"""How a request whose KV reaches the pool's host blocks shares the GPU with the others
(issue #42): pure, the clock injected; ``fair_scheduler`` (the time) and ``gpu_part``
(the GPU blocks) are its seats in vLLM's scheduler.

Every step that includes such a request waits for its host reads (~0.14 s for 6 GB over
PCIe), and so does every request batched with it. Four rules keep the others at GPU
speed (and fair_scheduler puts short prompts waiting with a new long one first):

- **A time share.** While other requests are waiting or running, the steps that include
  a spilled request take at most ``share`` of wall time, their host reads included (a
  long request counts from its first chunk, before it holds a host block: issue #54
  measured its GPU-only first chunks beside chats as unspaced long gaps): after
  such a step of ``t`` seconds beside them (from its scheduling: ``SpillShare``), the next
  one may start ``t * (1 - share) / share`` seconds later, and the steps in between run
  without it. Alone, it runs every step, and those steps' own lengths space nothing
  (issue #54: a spacing counted from them kept the spilled request out for most of a
  chat's life when chats came and went, 0.07 of the time at a share of 0.1); if others
  come while one runs, the wait they meet with starts at its end (below). Nor does the
  time apart count towards the spacing: what is left of it when they part is left when
  they meet again, so that over the time together its steps take the share, wave after
  wave. Where long requests first meet others (the first time since none was there),
  the first step waits half the spacing after one of ``LONG_STEP_S``
  (``FIRST_WAIT_OF_SPACING``), so that a wave of chats shorter than that never waits for
  one (issue #54, fair12: each wave met a spilled step at once, 0.22-0.25 of the waves'
  time at a share of 0.1, and a chat that saw a second long gap missed its p99 goal),
  and not the whole spacing, which left the waves one step fewer than their share
  (fair15: 0.060 of four waves' time). Either wait, first or left, runs from the end of
  a step it was taking alone as they came (fair13: a whole first wait from there kept a
  spilled decode out of every wave, 0.000 of their time at 0.1); a first wait met as a
  decode step ran alone is sized from that one's length (fair14: sized for a prefill
  chunk, it left four waves 0.043 of their time).
- **Long requests together hold at most half the GPU part** (a long request: one whose
  length could fill that half). Past it their new blocks come from host RAM, counted block
  by block (a prefill chunk larger than what is left of the half takes the rest from host
  RAM), so that the requests beside them find GPU blocks. Alone, such a request reads up
  to half the GPU part more over PCIe every step.
- **Beside a spilled request, the others keep to the GPU part.** Only a long request's
  steps are time-shared. A short request is admitted while its prompt and its expected
  answer (its max_tokens, at most ``GROWTH_RESERVE_TOKENS``) fit in the free GPU blocks
  beside what the running short requests are expected to grow by and what the long ones
  may still take of their half (one mid-prefill); otherwise it waits, as
  on a GPU pool of that size (a short request that reads host blocks slows every step it
  is in, and with them the whole batch: issue #54 measured 28x). One that outgrows its
  reserve takes host blocks rather than be preempted; with no short request running, one
  is always admitted.
- **A long request's prefill chunk beside others takes about ``LONG_STEP_S``**: its
  tokens are what its last measured chunk's rate gives in that time, at least
  ``MIN_LONG_CHUNK_TOKENS`` (vLLM's ``long_prefill_token_threshold`` for a step in which
  it may prefill, every prompt's chunk in it), so that the one long gap a chat sees
  stays short as the context grows (issue #54, fair8: 8,192-token chunks took 0.6 s at
  60,000 tokens of context and chats beside them 1.9x their time per token). A new long
  request's first chunk has no context: it is sized from the last first chunk's rate
  (vLLM's own chunk before one was measured), not from the rate the request before it
  ended on (fair10, fair11: a 1,024-token first chunk after a 60,000-token prompt took
  ~40 ms, the share spaced the next only ~0.4 s after it, and chats saw both); with async
  scheduling it is launched with no other step ``in_flight`` (fair_scheduler leaves one
  step empty first).

A share of 1 turns them off: patch 0006 alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# About the longest a long request's prefill step beside others takes: one such gap adds
# less than half of a 128-token chat's time at ~7 ms a token, and at a share of 0.1 the
# next comes 2.25 s later, after it (issue #54's goals: each chat within 1.5x its time per
# token and 3x its p99 gap alone). The chunk is sized from the last one's rate, which a
# growing context slows by some percent a chunk.
LONG_STEP_S = 0.25
# The part of a step's spacing that long requests wait where they first meet others: half,
# as if they met at a random moment between two steps, so that over the time together the
# spilled steps are the nearest whole count to its share, not always one fewer (issue #54,
# fair15 on an H100 whose decode step alone took 0.215 s: a whole spacing first left four
# waves of chats one step, 0.060 of their time at 0.1; share_sim: 0.118 at a half).
FIRST_WAIT_OF_SPACING = 0.5
# The fewest tokens of such a chunk: each chunk also pays what does not scale with its
# tokens (its host reads among them), and a rate measured across that cost would shrink the
# chunk towards nothing where that cost nears LONG_STEP_S (found in review).
MIN_LONG_CHUNK_TOKENS = 1024
# The fewest long-request tokens in a step that measure its prefill rate (a decode step's
# one token measures its host reads, not a chunk's cost).
MEASURED_CHUNK_TOKENS = 256
# The most of the pool's GPU part the long requests hold together before their new blocks
# come from host RAM.
MAX_GPU_PART_OF_LONG_REQUESTS = 0.5
# The tokens an admitted short request is expected to add to its prompt beside a spilled
# one (its max_tokens when smaller): a chat's answer; a longer one reads host blocks past it.
GROWTH_RESERVE_TOKENS = 1024


def read_share(value: object) -> float:
    """The share from --additional-config; ValueError names the fix."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(
            f"--additional-config kv_spilled_step_share must be a number in (0, 1], not {value!r}"
        )
    return float(value)


def long_part(gpu_blocks: int) -> int:
    """The GPU blocks the long requests may hold together."""
    return int(gpu_blocks * MAX_GPU_PART_OF_LONG_REQUESTS)


def is_long(blocks: int, gpu_blocks: int) -> bool:
    """Whether a request of this many blocks could fill the long requests' part."""
    return blocks >= long_part(gpu_blocks)


def gpu_allowance(long_blocks_held: int, gpu_blocks: int) -> int:
    """The GPU blocks the long requests may still take (``long_blocks_held``: theirs now)."""
    return max(0, long_part(gpu_blocks) - long_blocks_held)


def expected_blocks(prompt_tokens: int, max_tokens: int, block_tokens: int) -> int:
    """The blocks a short request is expected to hold beside a spilled one."""
    return -(-(prompt_tokens + min(max_tokens, GROWTH_RESERVE_TOKENS)) // block_tokens)


@dataclass(frozen=True)
class Step:
    """A step scheduled and not yet ended: when it was scheduled, whether it includes a
    spilled request (gpu_part's ``is_long``: a long one, from its first chunk), whether the share
    was in force (a spilled request and others), and whether others ran or waited beside
    it (a spilled step beside them spaces the next)."""

    key: object
    at: float
    spilled: bool
    shared: bool
    beside: bool
    long_tokens: int
    first_chunk: bool  # its long tokens are new long requests' first


@dataclass(kw_only=True)
class SpillShare:
    """The time-share rule. Call ``admit`` when a step is being scheduled (every step,
    whether or not anyone is beside a spilled request), ``started`` once it is (with a key
    for it and whether it includes a spilled request), ``ended`` with that key when its
    output arrives (steps end in the order they were scheduled), and ``start_over`` when
    no long request is left. ``shared_s`` and ``spilled_shared_s`` count the time of the steps taken
    while the share was in force, and of those that included a spilled request: what the
    rule gave, as the GPU's clock saw it.

    A step's length is the time from the later of its scheduling and the previous step's
    end to its own end (``shared_s`` adds these up: the wall time). Not the time between
    two schedulings: with async scheduling (vLLM 0.33's default on CUDA) vLLM schedules a
    step while the one before it runs, so that gap is ~0 after one step and two steps long
    after the next; measured on the GPU, a spilled request got into every other step, 92 %
    of the time at a share of 0.25. For the same reason no spilled step is admitted while
    another is still running: it would be scheduled before the first one's length is known.

    A spilled step's own length, which spaces the next, measures the long requests' rate
    and is what ``spilled_shared_s`` counts, runs from its scheduling: the end of the step
    before it is seen only when the engine next waits for an output, which may be as late
    as the spilled step's own end (issue #54, fair7 on an H100: a long request's first
    chunk counted 0.005 s of its 0.22 s, its second chunk ran 0.065 s later, and every
    chat saw both). So it is a bound from above, by at most the step before it (a short
    one: spilled steps never overlap; with async scheduling the step is scheduled as that
    one starts), and the share errs towards the others. ``spilled_shared_low_s`` counts
    the bound from below (from the later of its scheduling and that step's end as seen):
    the share given lies between the two."""

    share: float
    clock: Callable[[], float] = time.monotonic
    _running: list[Step] = field(default_factory=list, init=False)
    _last_end: float = field(default=-math.inf, init=False)
    _not_before: float = field(default=-math.inf, init=False)
    _long_tokens_per_s: float | None = field(default=None, init=False)  # none measured yet
    _first_tokens_per_s: float | None = field(default=None, init=False)  # of first chunks
    _apart_since: float | None = field(default=None, init=False)  # none beside it since
    _met_wait: float = field(default=0.0, init=False)  # the wait they last met with
    _met_first: bool = field(default=False, init=False)  # that wait is a first wait
    _fresh: bool = field(default=True, init=False)  # no spacing yet since start_over
    shared_s: float = field(default=0.0, init=False)
    spilled_shared_s: float = field(default=0.0, init=False)
    spilled_shared_low_s: float = field(default=0.0, init=False)

    def admit(self, *, others: bool) -> bool:
        """Whether the spilled requests go into the step now scheduled (called for every
        step); ``others``: whether a spilled request and any other request are running or
        waiting."""
        now = self.clock()
        if not others:
            if self._apart_since is None:
                self._apart_since = now
            return True
        if self._fresh:  # they first meet: as if half way after a long step beside them
            self._met_wait, self._met_first = self.first_wait(LONG_STEP_S), True
            self._fresh = False
            self._not_before = now + self._met_wait
        elif self._apart_since is not None:  # together again: the wait left when they parted
            self._met_wait = max(0.0, self._not_before - self._apart_since)
            self._met_first = False
            self._not_before = now + self._met_wait
        self._apart_since = None
        return now >= self._not_before and not any(s.spilled for s in self._running)

    def start_over(self) -> None:
        """No long request is left: the next one to meet others waits as the first."""
        self._fresh, self._apart_since = True, None

    def _spacing(self, step_s: float) -> float:
        """The wait after a spilled step of ``step_s`` beside others."""
        return step_s * (1 - self.share) / self.share

    def first_wait(self, step_s: float) -> float:
        """The wait where long requests first meet others, a step of theirs ``step_s``."""
        return FIRST_WAIT_OF_SPACING * self._spacing(step_s)

    def in_flight(self) -> bool:
        """Whether a step is scheduled and its output not yet seen."""
        return bool(self._running)

    def long_chunk_tokens(self, block_tokens: int, requests: int = 1, first: bool = False) -> int:
        """The tokens of each of ``requests`` long requests' next prefill chunks beside
        others (``first``: their first chunks): whole blocks, at least
        ``MIN_LONG_CHUNK_TOKENS`` together; 0 (no bound) before any such chunk was
        measured."""
        rate = self._first_tokens_per_s if first else self._long_tokens_per_s
        if rate is None:
            return 0
        tokens = max(MIN_LONG_CHUNK_TOKENS, LONG_STEP_S * rate)
        return max(1, int(tokens / max(1, requests)) // block_tokens) * block_tokens

    def started(
        self,
        key: object,
        *,
        spilled: bool,
        shared: bool = False,
        beside: bool = False,
        long_tokens: int = 0,
        first_chunk: bool = False,
    ) -> None:
        """A step scheduled; ``shared``: a spilled request was running beside others;
        ``beside``: others were running or waiting (a long request's first chunk, which
        spills as it is scheduled, has them beside it before the share is in force);
        ``long_tokens``: the long requests' tokens in it; ``first_chunk``: each began
        at its prompt's first token (no context, not after a prefix-cache hit)."""
        step = Step(
            key=key,
            at=self.clock(),
            spilled=spilled,
            shared=shared,
            beside=beside,
            long_tokens=long_tokens,
            first_chunk=first_chunk,
        )
        self._running.append(step)

    def ended(self, key: object) -> None:
        at = next((n for n, s in enumerate(self._running) if s.key is key), None)
        if at is None:
            return
        step, now = self._running[at], self.clock()
        del self._running[: at + 1]  # any before it ended unseen (steps end in order)
        took, own = now - max(step.at, self._last_end), now - step.at
        self._last_end = now
        if step.shared:
            self.shared_s += took
            self.spilled_shared_s += own if step.spilled else 0.0
            self.spilled_shared_low_s += took if step.spilled else 0.0
        if step.spilled and step.beside:  # taken alone, it kept no one waiting
            self._not_before, self._fresh = now + self._spacing(own), False
            if self._apart_since is not None:  # they parted as it ran: its wait starts now
                self._apart_since = now
        elif step.spilled and self._apart_since is None and not self._fresh:
            # taken alone, it ran on as others came: the wait they met with, first or
            # left from when they parted, starts at its end (found in review: an alone
            # chunk of 0.6 s took 0.6 s of a 2.25 s first wait; issue #54, fair13: a
            # whole first wait each time kept a spilled decode out of every wave)
            if self._met_first and step.long_tokens < MEASURED_CHUNK_TOKENS:
                # a decode step: the first wait sized from its length, not from a prefill
                # chunk's (issue #54, fair14: a 2.25 s first wait left four waves of chats
                # room for one 0.14 s decode step, 0.043 of their time at 0.1).
                # ``own`` spans it and, from its scheduling, the end of the step before
                # it, the same request's decode step alone: the longer part is its length,
                # where an end was seen late too, and longer, never shorter, where both
                # were. (A new long request's first chunk may take the next long step,
                # as after any decode step's spacing.)
                self._met_wait = self.first_wait(min(LONG_STEP_S, max(took, own - took)))
                self._met_first, self._not_before = False, now + self._met_wait
            else:
                self._not_before = max(self._not_before, now + self._met_wait)
        if step.long_tokens >= MEASURED_CHUNK_TOKENS and own > 0:
            self._long_tokens_per_s = step.long_tokens / own  # from below, as own is
            if step.first_chunk:
                self._first_tokens_per_s = self._long_tokens_per_s
