"""`vllm-offload bench` end to end on the CPU demo server (baseline arm, tiny sizes)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from testkit.server import server_env
from vllm_offload.bench.reuse import RESET_TIMEOUT_S
from vllm_offload.upstream.client import wait_until

pytestmark = pytest.mark.e2e


def test_bench_writes_results_and_plots(demo_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    argv = [
        sys.executable,
        "-m",
        "vllm_offload",
        "bench",
        "--model",
        str(demo_dir),
        "--arm",
        "base=baseline -- --max-num-seqs 8",
        "--repeats",
        "1",
        "--docs",
        "3",
        "--doc-tokens",
        "300",
        "--settle-seconds",
        "0.1",
        "--conversations",
        "2",
        "--turns",
        "2",
        "--turn-tokens",
        "100",
        "--workloads",
        "reuse,chat,sweep,decode,memory",
        "--rates",
        "sync,2,max",
        "--rate-seconds",
        "3",
        "--max-concurrency",
        "4",
        "--decode-batch",
        "3",
        "--prompt-tokens",
        "64",
        "--output-tokens",
        "8",
        "--pool-bytes",
        str(64 << 20),
        "--token-ids",
        "--out",
        str(out),
        "--",
        "--enforce-eager",
    ]
    done = subprocess.run(
        argv, env=server_env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["options"]["arms"] == [
        {"label": "base", "kind": "baseline", "flags": ["--", "--max-num-seqs", "8"]}
    ]
    baseline = results["arms"]["base"]
    assert baseline["memory"]["kv_cache_tokens"] == 32768
    assert "'max_num_seqs': 8" in (out / "base.log").read_text()  # the arm's own vLLM flag
    (run,) = baseline["runs"]
    assert run["reuse"]["errors"] == 0 and all(t > 0 for t in run["reuse"]["ttft_pass_s"])
    assert run["chat"]["errors"] == 0 and len(run["chat"]["ttft_by_turn_s"]) == 2
    assert run["reuse"]["settle_s"] == 0.1
    pass2 = run["reuse"]["server_per_doc"][1]  # the server's own timing of each document
    assert 0 < pass2["vllm:time_to_first_token_seconds_sum"] < run["reuse"]["ttft_pass_s"][1]
    assert pass2["vllm:request_prefill_time_seconds_sum"] > 0
    assert [row["rate_rps"] for row in run["sweep"]] == [None, 2.0, "max"]
    assert all(row["errors"] == 0 and row["output_tok_per_s"] > 0 for row in run["sweep"])
    sync, _, saturated = run["sweep"]
    # One client keeps one request in flight, the closed loop's four clients more than one
    # (2.87 measured on an idle box, 1.83 in a CI run sharing its 2 cores: the clients' own
    # streaming work competes with vLLM there, so only the overlap itself is asserted).
    assert sync["mean_in_flight"] <= 1.01 and saturated["mean_in_flight"] > 1
    assert all(0 < row["ttft_mean_s"] <= row["ttft_p99_s"] * 1.5 for row in run["sweep"])
    assert run["decode"]["errors"] == 0 and run["decode"]["decode_tok_per_s"] > 0
    assert results["decode_floor"] == {}  # no weights offloaded, no ceiling
    rows = list(csv.DictReader((out / "summary.csv").open()))
    expected = {
        "reuse.ttft_pass1",
        "sweep.sync.output_tok_per_s",
        "sweep.max.output_tok_per_s",
        "decode.decode_tok_per_s",
        "reuse.pass2.server.time_to_first_token",
        "sweep.max.ttft_mean_s",
    }
    assert expected <= {r["metric"] for r in rows}
    assert "| base | reuse.ttft_pass2 | s |" in (out / "summary.md").read_text()
    import matplotlib.image

    for name in ("ttft_by_pass.png", "sweep.png", "decode.png"):
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 200 and image.shape[1] > 400


def test_hit_bursts_read_documents_again_at_once(demo_dir: Path, tmp_path: Path) -> None:
    """--hit-concurrency: after the reuse passes, N new documents, the GPU prefix cache
    dropped through vLLM's dev route (the bench starts its servers with it), read again
    all at once, then once more. On the CPU demo server (no tier) the second read
    recomputes every token and the third hits the GPU prefix cache."""
    out = tmp_path / "bench"
    argv = [
        sys.executable,
        "-m",
        "vllm_offload",
        "bench",
        "--model",
        str(demo_dir),
        "--arms",
        "baseline",
        "--repeats",
        "1",
        "--workloads",
        "reuse",
        "--docs",
        "2",
        "--doc-tokens",
        "300",
        "--settle-seconds",
        "0.1",
        "--hit-concurrency",
        "1,3",
        "--pool-bytes",
        str(64 << 20),
        "--token-ids",
        "--h2d-gbps",
        "50",
        "--out",
        str(out),
        "--",
        "--enforce-eager",
        "--max-num-seqs",
        "4",
    ]
    done = subprocess.run(
        argv, env=server_env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["options"]["hit_concurrency"] == [1, 3]
    (run,) = results["arms"]["baseline"]["runs"]
    assert run["reuse"]["errors"] == 0
    one, three = run["reuse"]["bursts"]
    assert (one["concurrency"], three["concurrency"]) == (1, 3)
    for burst in (one, three):
        n = burst["concurrency"]
        for phase in ("cpu_hit", "gpu_hit"):
            ttfts = burst[phase]["ttft_s"]
            assert len(ttfts) == n and all(t and t > 0 for t in ttfts), (phase, burst)
            assert burst[phase]["wall_s"] >= max(ttfts)
        # The reset took time and succeeded in its bound (the zero GPU hits below show it
        # dropped the documents; #45: `reset_s >= 0` could not fail).
        assert len(burst["cold_ttft_s"]) == n and 0 < burst["reset_s"] < RESET_TIMEOUT_S
        cpu, gpu = burst["cpu_hit"]["server"], burst["gpu_hit"]["server"]
        # After the reset nothing of the documents is in the GPU pool; after that read
        # all of them is (vLLM recomputes a prompt's last block).
        assert cpu["vllm:prefix_cache_queries"] == 300 * n
        assert cpu["vllm:prefix_cache_hits"] == 0
        assert gpu["vllm:prefix_cache_hits"] >= 200 * n
        assert burst["load_gbps"] is None  # no tier, nothing loaded
    rows = {r["metric"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert {
        "burst1.cpu_hit_ttft.requests",
        "burst3.gpu_hit_ttft.requests",
        "burst3.cpu_over_gpu",
        "burst3.load_bytes",
    } <= set(rows)
    assert float(rows["burst3.load_bytes"]["median"]) == 0
    assert rows["burst3.cpu_over_floor"]["median"] == ""  # no load, no floor
    assert "VLLM_SERVER_DEV_MODE" not in os.environ  # only the servers got it


def test_an_arm_whose_server_dies_ends_alone(demo_dir: Path, tmp_path: Path) -> None:
    """One arm's server is killed (-9, its whole session) after the first repeat, as an
    engine that dies mid-run: that arm is marked failed with the error, the other arm runs
    every repeat, results.json is written and the command exits 1. (On the H200 a dead
    native engine once ended a whole three-arm run at its next request.)"""
    out = tmp_path / "bench"
    argv = [
        sys.executable,
        "-m",
        "vllm_offload",
        "bench",
        "--model",
        str(demo_dir),
        "--arm",
        "base=baseline",
        "--arm",
        "doomed=baseline",
        "--repeats",
        "3",
        "--workloads",
        "reuse",
        "--docs",
        "3",
        "--doc-tokens",
        "300",
        "--settle-seconds",
        "0.5",
        "--pool-bytes",
        str(64 << 20),
        "--token-ids",
        "--out",
        str(out),
        "--",
        "--enforce-eager",
        "--max-num-seqs",
        "4",
    ]
    bench = subprocess.Popen(
        argv, env=server_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        partial = out / "results.partial.json"
        wait_until(
            partial.exists, 600, "the first repeat", alive=lambda: bench.poll() is None, poll_s=0.2
        )
        doomed = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "--model-served-name" in (p.info["cmdline"] or [])
            and log_of(p) == out / "doomed.log"
        ]
        assert len(doomed) == 1, "the doomed arm's `vllm-offload serve`"
        os.killpg(os.getpgid(doomed[0].pid), signal.SIGKILL)
        _, stderr = bench.communicate(timeout=600)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 1, stderr[-3000:]
    assert "arm doomed failed" in stderr
    results = json.loads((out / "results.json").read_text())
    base, dead = results["arms"]["base"], results["arms"]["doomed"]
    assert len(base["runs"]) == 3 and all(r["reuse"]["errors"] == 0 for r in base["runs"])
    assert len(dead["runs"]) < 3 and "its server exited" in dead["failed"]
    assert "Failed: doomed, repeat" in (out / "summary.md").read_text()


def log_of(process: psutil.Process) -> Path | None:
    """Where the process writes its stdout (ServerProcess sends it to the arm's log)."""
    try:
        return Path(os.readlink(f"/proc/{process.pid}/fd/1"))
    except OSError:
        return None


def test_bench_bad_input_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_offload",
            "bench",
            "--model",
            str(tmp_path),
            "--arms",
            "baseline,disk",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "choose from baseline, native, lmcache" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "vllm_offload", "bench", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "no config.json there" in done.stderr
    bench = [sys.executable, "-m", "vllm_offload", "bench", "--model", str(tmp_path)]
    for arm, message in (
        ("x=disk", "KIND one of baseline, native, lmcache"),
        ("a b=native", "the label may hold"),
    ):
        done = subprocess.run([*bench, "--arm", arm], capture_output=True, text=True)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    for counts in ("0", "1,x"):
        done = subprocess.run([*bench, "--hit-concurrency", counts], capture_output=True, text=True)
        assert done.returncode == 2 and "--hit-concurrency" in done.stderr, done.stderr
    done = subprocess.run(
        [*bench, "--arms", "native", "--arm", "native=native --max-num-seqs 2"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "labels must differ" in done.stderr


def test_arm_parse() -> None:
    from vllm_offload.bench.options import Arm

    assert Arm.parse("native") == Arm(label="native", kind="native")
    assert Arm.parse("c256=native --kv-offload-cpu-chunk-tokens 256") == Arm(
        label="c256", kind="native", flags=("--kv-offload-cpu-chunk-tokens", "256")
    )
