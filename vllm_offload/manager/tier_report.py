"""Is the CPU tier paying off? From vLLM's own counters: prompt tokens served from the
tier against those computed again, the prefill time that saved (at the prefill rate this
server measured), how full the tier is, and the store traffic it cost; over the last ten
minutes and since the server started. Users report "offload did nothing for me" and "a
busy tier looked idle": this says which, in numbers, and says so plainly when the tier
has stored much and served nothing for an hour."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_offload.upstream import metrics as vm

# vLLM metric -> Totals field. Counters run since the server started.
SOURCES = {
    vm.CPU_TIER_HITS: "served_tokens",
    vm.GPU_PREFIX_HITS: "gpu_hit_tokens",
    vm.PROMPT_TOKENS: "prompt_tokens",
    f"{vm.PREFILL_TIME}_sum": "prefill_s",
    vm.OFFLOAD_STORE_BYTES: "store_bytes",
    vm.OFFLOAD_LOAD_BYTES: "load_bytes",
    vm.CPU_TIER_BUSY: "busy",
    vm.DISK_READ_BYTES: "disk_read_bytes",
    vm.DISK_READ_TIME: "disk_read_s",
    vm.DISK_WRITE_BYTES: "disk_write_bytes",
    vm.DISK_WRITE_TIME: "disk_write_s",
}
QUIET_VERDICT_S = 3600.0
STORED_MUCH_BYTES = 1 << 30


@dataclass(frozen=True, kw_only=True)
class Totals:
    served_tokens: float = 0.0
    gpu_hit_tokens: float = 0.0
    prompt_tokens: float = 0.0
    prefill_s: float = 0.0
    store_bytes: float = 0.0
    load_bytes: float = 0.0
    disk_read_bytes: float = 0.0
    disk_read_s: float = 0.0  # summed over transfers (several run at once)
    disk_write_bytes: float = 0.0
    disk_write_s: float = 0.0
    # Fraction of the tier pinned by transfers in flight (vLLM's "usage" gauge: not how
    # full it is; measured on the H200, 0.0 with 23 GB stored). None: not exported.
    busy: float | None = None

    @classmethod
    def from_metrics(cls, scraped: dict[str, float]) -> Totals:
        values = {key: scraped.get(name, 0.0) for name, key in SOURCES.items() if key != "busy"}
        return cls(**values, busy=scraped.get(vm.CPU_TIER_BUSY))

    @property
    def computed_tokens(self) -> float:
        """Prompt tokens prefilled again: neither a GPU prefix hit nor a tier hit."""
        return max(0.0, self.prompt_tokens - self.gpu_hit_tokens - self.served_tokens)


def _span(now: Totals, then: Totals, prefill_tokens_per_s: float | None) -> dict[str, Any]:
    served = max(0.0, now.served_tokens - then.served_tokens)
    prompt = max(0.0, now.prompt_tokens - then.prompt_tokens)
    return {
        "served_tokens": served,
        "prompt_tokens": prompt,
        # The hit rate: of all prompt tokens (vLLM counts GPU prefix hits among them too),
        # those whose KV was loaded from the CPU tier. None: no prompt yet.
        "hit_rate": min(1.0, served / prompt) if prompt > 0 else None,
        "computed_tokens": max(0.0, now.computed_tokens - then.computed_tokens),
        "prefill_saved_s": None if prefill_tokens_per_s is None else served / prefill_tokens_per_s,
        "store_bytes": max(0.0, now.store_bytes - then.store_bytes),
        "load_bytes": max(0.0, now.load_bytes - then.load_bytes),
    }


def report(
    latest: Totals | None,
    window_start: Totals | None,
    tier_bytes: int,
    served_quiet_s: float,
) -> dict[str, Any]:
    """The CPU-tier card: ``latest`` counters, those at the start of the ten-minute window,
    the planned tier size, and how long the served-token counter has not moved."""
    if tier_bytes <= 0:
        return {
            "available": False,
            "size_bytes": 0,
            "why": "this server has no CPU tier (kv_offload)",
        }
    if latest is None:
        return {"available": False, "why": "the server is not answering /metrics"}
    rate = latest.computed_tokens / latest.prefill_s if latest.prefill_s > 0 else None
    since_start = _span(latest, Totals(), rate)
    verdict = None
    if served_quiet_s >= QUIET_VERDICT_S and since_start["store_bytes"] >= STORED_MUCH_BYTES:
        verdict = (
            f"nothing reused for {served_quiet_s / 3600:.1f} h while "
            f"{since_start['store_bytes'] / (1 << 30):.1f} GiB were stored: consider "
            "kv_offload.store_threshold = 2 (copy a chunk to the tier only once it was "
            "looked up twice)"
        )
    return {
        "available": True,
        "size_bytes": tier_bytes,
        # vLLM exports no fill level. The tier frees nothing it stored (it evicts to make
        # room), so it holds what was stored since the start, up to its size.
        "filled_bytes": min(float(tier_bytes), latest.store_bytes),
        "busy": latest.busy,
        "prefill_tokens_per_s": rate,
        "last_10_min": _span(latest, window_start or Totals(), rate),
        "since_start": since_start,
        "verdict": verdict,
    }


def _disk_span(now: Totals, then: Totals) -> dict[str, Any]:
    read, wrote = (
        now.disk_read_bytes - then.disk_read_bytes,
        now.disk_write_bytes - then.disk_write_bytes,
    )
    read_s, write_s = now.disk_read_s - then.disk_read_s, now.disk_write_s - then.disk_write_s
    return {
        "read_bytes": max(0.0, read),
        "write_bytes": max(0.0, wrote),
        "read_bytes_per_s": read / read_s if read_s > 0 else None,
        "write_bytes_per_s": wrote / write_s if write_s > 0 else None,
    }


def disk_report(
    latest: Totals | None,
    window_start: Totals | None,
    disk_bytes: int,
    status: dict[str, float] | None,
) -> dict[str, Any]:
    """The disk tier's card: its size, what it holds (its own account, ``status``), what it
    read (served) and wrote over the last ten minutes and since the start, and at what
    speed per transfer."""
    if disk_bytes <= 0:
        return {"available": False, "why": "this server has no disk tier (kv_offload.disk_path)"}
    if latest is None:
        return {"available": False, "why": "the server is not answering /metrics"}
    return {
        "available": True,
        "size_bytes": disk_bytes,
        "held_bytes": None if status is None else status.get("used_bytes"),
        "evicted_bytes": None if status is None else status.get("evicted_bytes"),
        "last_10_min": _disk_span(latest, window_start or Totals()),
        "since_start": _disk_span(latest, Totals()),
    }
