"""The disk tier (issue #20): planned and refused by the planner, built into vLLM's own
tiering spec by the launcher, and bounded by ``vllm_ext.disk_tier.BoundedFsTier`` — driven here
through vLLM 0.32's real TieringOffloadingSpec and SecondaryTierFactory (the tier's file
layer needs no GPU: it copies between files and a host buffer)."""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import make_host
from tests.shapes import LLAMA3_8B, write_shape
from vllm_offload import disk_layout, launch
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.disk_facts import DiskFacts, probe_disk
from vllm_offload.errors import Refused
from vllm_offload.hardware import GIB
from vllm_offload.model import facts as model_facts
from vllm_offload.plan import make_plan

CHUNK = 64 * 1024  # bytes of one offloaded chunk in these tests


def disk_facts(path: Path, **changes: Any) -> DiskFacts:
    facts = DiskFacts(
        path=str(path),
        exists=True,
        writable=True,
        filesystem="ext4",
        total_bytes=1000 * GIB,
        o_direct=True,
    )
    return replace(facts, **changes)


def plan_with_disk(model: Path, disk: DiskFacts | None, **overrides: Any) -> Any:
    values = {"model.path": str(model), "kv_offload.disk_path": "/nvme/kv", **overrides}
    config = with_overrides(DeploymentConfig(), values)
    return make_plan(config, model_facts.read(model), make_host(24), "cuda", env={}, disk=disk)


def test_the_planner_sizes_and_refuses_the_disk_tier(tmp_path: Path) -> None:
    model = write_shape(tmp_path / "m", LLAMA3_8B)
    plan = plan_with_disk(model, disk_facts(tmp_path))
    # 'auto': half of (1000 GiB less the 5 % reserve), whole GiB; tokens at 128 KiB each
    assert plan.disk.reserve_bytes == 50 * GIB and plan.disk.bytes == 475 * GIB
    assert plan.disk.tokens == 475 * GIB // (128 * 1024) // 128 * 128
    fingerprint = model_facts.read(model).fingerprint
    assert plan.disk.root == f"/nvme/kv/{disk_layout.TIER_DIR}/{fingerprint}"
    assert plan.notes.problems == () and any(
        "disk_gib auto -> 475" in d for d in plan.notes.decisions
    )
    cases = [
        (None, {}, "kv_offload.disk_path", "does not exist"),
        (disk_facts(tmp_path, exists=False), {}, "kv_offload.disk_path", "mkdir -p"),
        (disk_facts(tmp_path, writable=False), {}, "kv_offload.disk_path", "not writable"),
        (disk_facts(tmp_path, filesystem="tmpfs"), {}, "kv_offload.disk_path", "RAM"),
        (disk_facts(tmp_path), {"kv_offload.disk_gib": 960.0}, "kv_offload.disk_gib", "<= 950"),
        (disk_facts(tmp_path), {"kv_offload.disk_gib": 0.5}, "kv_offload.disk_gib", "less than"),
        (disk_facts(tmp_path), {"kv_offload.backend": "lmcache"}, "kv_offload.disk_path", "native"),
        # vLLM's tiering spec raises on a store threshold (tiering/spec.py)
        (
            disk_facts(tmp_path),
            {"kv_offload.store_threshold": 2},
            "kv_offload.store_threshold",
            "does not take",
        ),
        (disk_facts(tmp_path), {"kv_offload.disk_path": "/"}, "kv_offload.disk_path", "root"),
    ]
    for disk, overrides, field, words in cases:
        refused = plan_with_disk(model, disk, **overrides)
        found = [(p["field"], words in p["message"]) for p in refused.notes.problems]
        assert found == [(field, True)]
        assert refused.disk.bytes == 0
    warned = plan_with_disk(model, disk_facts(tmp_path, filesystem="nfs4", o_direct=False))
    assert any("network filesystem" in w for w in warned.notes.warnings)
    assert any("O_DIRECT" in w for w in warned.notes.warnings)


def test_probe_disk_reads_the_real_filesystem(tmp_path: Path) -> None:
    facts = probe_disk(str(tmp_path))
    assert facts.exists and facts.writable and facts.total_bytes > 0 and facts.filesystem
    assert list(tmp_path.iterdir()) == []  # the O_DIRECT probe file is gone
    assert probe_disk("/dev/shm").filesystem == "tmpfs"
    assert not probe_disk(str(tmp_path / "missing")).exists


def test_the_launcher_builds_vllms_tiering_spec(tmp_path: Path) -> None:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    model = write_shape(tmp_path / "m", LLAMA3_8B)
    values = {"model.path": str(model), "kv_offload.disk_path": str(tmp_path)}
    config = with_overrides(DeploymentConfig(), values)
    plan = make_plan(
        config,
        model_facts.read(model),
        make_host(24),
        "cuda",
        env={},
        disk=probe_disk(str(tmp_path)),
    )
    spec = launch.build(config, plan, model)
    parser = make_arg_parser(FlexibleArgumentParser())  # the server's own
    engine = EngineArgs.from_cli_args(parser.parse_args(spec.args))
    transfer = engine.kv_transfer_config  # parsed by vLLM's own parser, into its own class
    assert isinstance(transfer, KVTransferConfig)
    extra = transfer.kv_connector_extra_config
    assert transfer.kv_connector == "OffloadingConnector"
    assert extra["spec_name"] == "TieringOffloadingSpec"
    OffloadingSpecFactory._registry[extra["spec_name"]]()  # a spec vLLM knows
    (tier,) = extra["secondary_tiers"]
    assert SecondaryTierFactory.get_tier_class(tier).__name__ == "BoundedFsTier"
    assert tier["budget_root"] == str(tmp_path / disk_layout.TIER_DIR)
    assert tier["max_bytes"] == plan.disk.bytes
    assert tier["root_dir"] == plan.disk.root
    without = with_overrides(config, {"kv_offload.disk_path": ""})
    plain = make_plan(without, model_facts.read(model), make_host(24), "cuda", env={}, disk=None)
    extra = launch.build(without, plain, model).kv_transfer_config
    assert extra is not None and "spec_name" not in extra["kv_connector_extra_config"]


# --- the bound, through vLLM's own tiering classes ----------------------------------------


def tiering_spec(dtype: str = "bfloat16", tokens_per_block: int = 16) -> Any:
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    parallel = OffloadingParallelConfig(
        rank=0,
        world_size=1,
        tp_size=1,
        pp_size=1,
        pcp_size=1,
        dcp_size=1,
        data_parallel_index=0,
        data_parallel_size=1,
        data_parallel_rank_local=None,
        is_parallelism_agnostic=True,
    )
    return TieringOffloadingSpec(
        OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block, ("layer.0",), 0),),
            worker_kv_bytes_per_block=CHUNK,
            enable_kv_cache_events=False,
            extra_config={"cpu_bytes_to_use": 64 * CHUNK},
            engine_id="test",
            model=OffloadingModelConfig("m", dtype),
            cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_block, blocks_per_chunk=1),
            parallel=parallel,
        )
    )


class Tier:
    """A BoundedFsTier made by vLLM's SecondaryTierFactory over a 64-chunk host buffer."""

    buffer: Any

    def __init__(self, root: Path, max_chunks: int, min_free_bytes: int = 0, **spec: Any):
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

        # Page-aligned like vLLM's shared CPU region (O_DIRECT needs aligned buffers).
        self.region = mmap.mmap(-1, 64 * CHUNK)
        self.buffer = np.frombuffer(self.region, dtype=np.uint8).reshape(64, CHUNK)
        tier = disk_layout.tier_root(str(root))
        self.tier = SecondaryTierFactory.create_secondary_tier(
            {
                "type": "BoundedFsTier",
                "module_path": "vllm_offload.vllm_ext.disk_tier",
                "root_dir": str(tier / "model-fingerprint"),
                "budget_root": str(tier),
                "max_bytes": max_chunks * CHUNK,
                "min_free_bytes": min_free_bytes,
                "n_read_threads": 2,
                "n_write_threads": 2,
            },
            memoryview(self.buffer),
            tiering_spec(**spec),
        )
        self.jobs = 0

    def _run(self, submit: Any, keys: list[bytes], chunks: list[int]) -> bool:
        from vllm.v1.kv_offload.base import ReqContext
        from vllm.v1.kv_offload.tiering.base import TransferJob

        self.jobs += 1
        job = TransferJob(self.jobs, keys, np.array(chunks, dtype=np.int64), False, ReqContext("r"))
        submit(job)
        deadline = time.monotonic() + 120  # a busy 2-core box: generous
        while time.monotonic() < deadline:
            for result in self.tier.get_finished_jobs():
                if result.job_id == job.job_id:
                    self.tier.budget.settle()  # evictions leave the disk off this thread
                    return bool(result.success)
            time.sleep(0.005)
        raise TimeoutError("the disk tier did not finish a job in 120 s")

    def store(self, keys: list[bytes], value: int) -> bool:
        chunks = list(range(len(keys)))
        self.buffer[chunks] = value
        return self._run(self.tier.submit_store, keys, chunks)

    def load(self, key: bytes) -> int | None:
        self.buffer[63] = 0
        return int(self.buffer[63][0]) if self._run(self.tier.submit_load, [key], [63]) else None

    def path(self, key: bytes) -> str:
        return str(self.tier.file_mapper.get_file_name(key))

    def close(self) -> None:
        self.tier.shutdown()
        os.close(self.tier._in_use)


def key(i: int) -> bytes:
    from vllm.v1.kv_offload.base import make_offload_key

    return make_offload_key(i.to_bytes(32, "big"), 0)


def on_disk(root: Path) -> int:
    return sum(e.stat().st_size for e in disk_layout.block_files(root))


def test_the_tier_stays_within_its_bound_least_recent_first(tmp_path: Path) -> None:
    tier = Tier(tmp_path, max_chunks=10)
    try:
        for i in range(0, 24, 2):  # more than 2x the bound, two chunks a job
            assert tier.store([key(i), key(i + 1)], value=i + 1)
            assert on_disk(tmp_path) <= 10 * CHUNK
            assert tier.tier.budget.used_bytes == on_disk(tmp_path)
            if i == 18:  # 11-19 held; 12, read now, becomes more recent than 13-19
                assert tier.load(key(12)) == 13
        # Past 10 chunks it evicts down to 9 (LOW_WATER), oldest first: 0-2, 3-4, ... 9-10,
        # then 11 and 13 (12 was read), then 14-15.
        kept = {i for i in range(24) if os.path.exists(tier.path(key(i)))}
        assert kept == {12, *range(16, 24)}
        assert tier.load(key(15)) is None  # evicted: a miss, recomputed, never wrong KV
        assert tier.load(key(23)) == 23
    finally:
        tier.close()
    # A restart finds what was there (and keeps the bound); the same model and layout read
    # the same files, a changed dtype or block size lands elsewhere and finds nothing.
    again = Tier(tmp_path, max_chunks=10)
    try:
        assert again.tier.budget.used_bytes == 9 * CHUNK and again.load(key(23)) == 23
        status = disk_layout.read_status(str(tmp_path))  # its account for the manager's page
        assert status is not None and status["used_bytes"] == 9 * CHUNK
    finally:
        again.close()
    for changed in ({"dtype": "float16"}, {"tokens_per_block": 32}):
        other = Tier(tmp_path, max_chunks=10, **changed)
        try:
            assert not os.path.exists(other.path(key(23))) and other.load(key(23)) is None
        finally:
            other.close()


def test_the_free_space_reserve_wins_over_the_budget(tmp_path: Path) -> None:
    """A reserve the filesystem cannot meet: every chunk goes once written."""
    tier = Tier(tmp_path, max_chunks=100, min_free_bytes=1 << 62)
    try:
        for i in range(4):
            assert tier.store([key(i)], value=1)
        tier.store([key(9)], value=1)
        assert on_disk(tmp_path) <= CHUNK  # only the last write, protected while in flight
    finally:
        tier.close()


def test_cache_clear_removes_the_tier_only_and_not_under_a_server(tmp_path: Path) -> None:
    """Files beside the tier's folder (a model's weights on the same NVMe) and files in it
    that are not of vLLM's layout are never counted, evicted or cleared."""
    (tmp_path / "pytorch_model.bin").write_bytes(b"weights")
    stray = disk_layout.tier_root(str(tmp_path)) / "notes.bin"
    stray.parent.mkdir()
    stray.write_bytes(b"not the tier's")
    tier = Tier(tmp_path, max_chunks=8)
    tier.store([key(1), key(2)], value=1)
    assert tier.tier.budget.used_bytes == 2 * CHUNK
    with pytest.raises(RuntimeError, match="another server"):  # one server per tier
        Tier(tmp_path, max_chunks=8)
    with pytest.raises(Refused, match="running server"):
        disk_layout.clear_tier(str(tmp_path))
    assert on_disk(tmp_path) == 2 * CHUNK
    tier.close()
    assert disk_layout.clear_tier(str(tmp_path)) == (2, 2 * CHUNK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pytorch_model.bin", disk_layout.TIER_DIR]
    assert sorted(p.name for p in stray.parent.iterdir()) == [disk_layout.LOCK_FILE, "notes.bin"]
    with pytest.raises(Refused, match="no disk tier"):
        disk_layout.clear_tier("")


def test_changed_weights_change_the_fingerprint(tmp_path: Path) -> None:
    model = write_shape(tmp_path / "m", LLAMA3_8B)
    header = b'{"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}'
    weights = model / "model.safetensors"
    weights.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    before = model_facts.read(model).fingerprint
    assert model_facts.read(model).fingerprint == before  # stable while nothing changes
    os.utime(weights, ns=(1, 1))  # new weights, same path and size
    assert model_facts.read(model).fingerprint != before
