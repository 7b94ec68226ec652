"""A background sampler: host (psutil), GPUs (NVML) and vLLM's own /metrics, once a
second, kept for ten minutes. Readers get copies; the sampler never blocks them."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from vllm_offload.hardware import nvml_devices
from vllm_offload.manager import tier_report, wedge
from vllm_offload.upstream import metrics as vm
from vllm_offload.upstream.client import VllmClient, sum_samples, totals

HISTORY_S = 600
# A scrape older than this says nothing of now (a sample takes < 2 s: two calls of 0.8 s).
FRESH_S = 10.0

# vLLM metric -> our name; counters become per-second rates between samples.
GAUGES = {
    vm.RUNNING: "running",
    vm.WAITING: "waiting",
    vm.GPU_KV_USAGE: "gpu_kv_usage",
    vm.CPU_TIER_BUSY: "cpu_tier_busy",
}
COUNTERS = {
    vm.CPU_TIER_HITS: "cpu_tier_hit_tokens_per_s",
    vm.GPU_PREFIX_HITS: "gpu_prefix_hit_tokens_per_s",
    vm.PROMPT_TOKENS: "prompt_tokens_per_s",
    vm.GENERATION_TOKENS: "generation_tokens_per_s",
    vm.PREEMPTIONS: "preemptions_per_s",
    vm.OFFLOAD_LOAD_BYTES: "offload_load_bytes_per_s",
    vm.OFFLOAD_STORE_BYTES: "offload_store_bytes_per_s",
}
TTFT = vm.TTFT
# The per-model views keep this many served names, each this long at most: the names are
# labels of whatever answers the server's port.
MAX_MODELS = 16
MAX_NAME = 200


VLLM_METRICS = {
    *GAUGES,
    *COUNTERS,
    *wedge.SOURCES,
    *tier_report.SOURCES,
    f"{TTFT}_sum",
    f"{TTFT}_count",
}


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """The metrics we chart."""
    return sum_samples(text, VLLM_METRICS)


def vllm_view(
    scraped: dict[str, float], previous: dict[str, float], dt: float
) -> dict[str, float | None]:
    """What the charts show of one scrape: the gauges, the counters as rates since
    ``previous`` (``dt`` seconds before; none without it) and the mean time to first token
    of the requests that got theirs in between, filed by whether CPU-tier hits came."""
    vllm: dict[str, float | None] = {name: scraped.get(source) for source, name in GAUGES.items()}
    for source, name in COUNTERS.items():
        if dt > 0 and source in scraped and source in previous:
            vllm[name] = max(0.0, (scraped[source] - previous[source]) / dt)
    count = scraped.get(f"{TTFT}_count", 0.0) - previous.get(f"{TTFT}_count", 0.0)
    if previous and count > 0:
        mean = (scraped.get(f"{TTFT}_sum", 0.0) - previous.get(f"{TTFT}_sum", 0.0)) / count
        vllm["ttft_mean_s"] = mean
        hits = vllm.get("cpu_tier_hit_tokens_per_s") or 0.0
        vllm["ttft_with_cpu_hits_s" if hits > 0 else "ttft_without_cpu_hits_s"] = mean
    return vllm


def _gpus() -> list[dict[str, Any]]:
    rows = []
    with nvml_devices() as (nvml, handles):
        for i, handle in enumerate(handles):
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            rows.append(
                {
                    "index": i,
                    "util_percent": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    "memory_used_bytes": int(mem.used),
                    "memory_total_bytes": int(mem.total),
                    "temperature_c": nvml.nvmlDeviceGetTemperature(handle, 0),
                    "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                }
            )
    return rows


def _disks() -> list[dict[str, Any]]:
    rows = []
    for part in psutil.disk_partitions(all=False):
        try:
            usage = psutil.disk_usage(part.mountpoint)
        except OSError:
            continue
        rows.append({"mount": part.mountpoint, "used_percent": usage.percent})
    return rows


@dataclass(kw_only=True)
class Sampler:
    """Samples every ``interval_s`` in a daemon thread; ``server_url`` is vLLM's base URL
    (``follow`` moves it when the config's host or port changes)."""

    server_url: str
    interval_s: float = 1.0
    samples: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY_S))
    server_healthy: bool = False
    # The last sample's scrape of vLLM's /metrics; None when the server did not answer.
    latest: dict[str, float] | None = None
    latest_at: float | None = None  # when ``latest`` was taken (monotonic)
    # The CPU tier's counters over the last ten minutes, and when served tokens last grew.
    tier: deque[tier_report.Totals] = field(default_factory=lambda: deque(maxlen=HISTORY_S))
    served_moved_at: float | None = None
    _previous: dict[str, float] = field(default_factory=dict)
    _previous_by_model: dict[str, dict[str, float]] = field(default_factory=dict)
    _previous_t: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: VllmClient | None = None

    @property
    def server(self) -> VllmClient:
        """The client for ``server_url``, made anew once it changes."""
        server = self._server
        if server is None or server.base_url != self.server_url:
            if server is not None:
                server.close()
            server = self._server = VllmClient(self.server_url, timeout_s=0.8)
        return server

    def follow(self, server_url: str) -> None:
        """Sample the server at ``server_url`` from now on (a saved host or port)."""
        if server_url != self.server_url:
            self.server_url = server_url
            self._previous, self.server_healthy, self.latest = {}, False, None
            self._previous_by_model = {}
            self.tier.clear()
            self.served_moved_at = None

    def start(self) -> None:
        psutil.cpu_percent()  # prime: the first call has no interval to measure
        threading.Thread(target=self._loop, name="metrics-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            with contextlib.suppress(Exception):  # a bad sample must not kill the sampler
                self.sample_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def _scrape(self) -> dict[str, dict[str, float]] | None:
        try:
            return self.server.metrics_by_model(VLLM_METRICS)
        except (httpx.HTTPError, ValueError):
            return None

    def fresh(self) -> dict[str, float] | None:
        """``latest`` if this sampler went round within FRESH_S (a sampler held up in a
        call, say a disk's usage on a hung mount, keeps a scrape that says nothing of now:
        the wedge watch would take it for an engine without progress)."""
        fresh = self.latest_at is not None and time.monotonic() - self.latest_at < FRESH_S
        return self.latest if fresh else None

    def probe_health(self) -> bool:
        return self.server.healthy()

    def sample_once(self) -> dict[str, Any]:
        now = time.time()
        vm, swap = psutil.virtual_memory(), psutil.swap_memory()
        sample: dict[str, Any] = {
            "t": round(now, 3),
            "cpu_percent": psutil.cpu_percent(),
            "ram_used_bytes": int(vm.total - vm.available),
            "ram_total_bytes": int(vm.total),
            "swap_used_bytes": int(swap.used),
            "disks": _disks(),
            "gpus": _gpus(),
        }
        self.server_healthy = self.probe_health()
        by_model = self._scrape() if self.server_healthy else None
        scraped = self.latest = None if by_model is None else totals(by_model.values())
        self.latest_at = time.monotonic()
        vllm: dict[str, float | None] = {}
        models: dict[str, dict[str, float | None]] = {}
        if scraped is not None and by_model is not None:
            dt = now - self._previous_t if self._previous else 0.0
            vllm = vllm_view(scraped, self._previous, dt)
            named = [n for n in by_model if n and len(n) <= MAX_NAME][:MAX_MODELS]
            previous = self._previous_by_model
            models = {n: vllm_view(by_model[n], previous.get(n, {}), dt) for n in named}
            self._previous, self._previous_t = scraped, now
            self._previous_by_model = {n: by_model[n] for n in named}
            self._track_tier(tier_report.Totals.from_metrics(scraped))
        sample["vllm_models"] = models  # each served model's own view (several models)
        sample["vllm"] = vllm
        with self._lock:
            self.samples.append(sample)
        return sample

    def _track_tier(self, totals: tier_report.Totals) -> None:
        last = self.tier[-1] if self.tier else None
        if self.served_moved_at is None or (last and totals.served_tokens > last.served_tokens):
            self.served_moved_at = time.monotonic()
        with self._lock:
            self.tier.append(totals)

    def _window(self) -> tuple[tier_report.Totals | None, tier_report.Totals | None]:
        """(the counters ten minutes ago, the latest ones if the server still answers)."""
        with self._lock:
            first, latest = (self.tier[0], self.tier[-1]) if self.tier else (None, None)
        return first, latest if self.latest is not None else None

    def tier_card(self, tier_bytes: int) -> dict[str, Any]:
        """tier_report.report over what this sampler has seen."""
        first, fresh = self._window()
        quiet = 0.0 if self.served_moved_at is None else time.monotonic() - self.served_moved_at
        return tier_report.report(fresh, first, tier_bytes, quiet)

    def disk_card(self, disk_bytes: int, status: dict[str, float] | None) -> dict[str, Any]:
        """tier_report.disk_report over what this sampler has seen."""
        first, fresh = self._window()
        return tier_report.disk_report(fresh, first, disk_bytes, status)

    def since(self, t: float) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.samples if s["t"] > t]
