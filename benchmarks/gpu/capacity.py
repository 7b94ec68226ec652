#!/usr/bin/env python3
"""Issue #13 on the GPU host, through `vllm-offload serve` with the patched release on
PYTHONPATH (see capacity.sh):

1. `serve` with no config (demo model, auto CPU tier sized from the host's RAM) comes up
   healthy and answers; vLLM's own "CPU tier check" line says what its processes held.
2. A flag the launcher writes, passed after `--`, is refused (exit 2) in seconds.
3. A 1 GiB GPU pool of the Llama-3-8B shape (64 blocks of 128 tokens, one of them vLLM's
   null block) with a 16 GiB CPU tier: max_model_len 8,192 is refused before vLLM starts
   (exit 2 naming 8,064); with max_model_len auto vLLM serves 8,064, a 8,150-token prompt
   gets HTTP 400 at once, and requests of 8,000 and 64 tokens are answered.

Writes OUT/capacity-RELEASE.json and the servers' logs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vllm_offload.bench.server_process import VLLM_OFFLOAD, ServerProcess
from vllm_offload.upstream.client import VllmClient

MODEL = "benchmarks/models/llama-3-8b"
DUMMY = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager"]
POOL_64_BLOCKS = 64 * 128 * 131072  # 1 GiB: 64 blocks of 128 tokens at 128 KiB a token


def lines(log: Path, *patterns: str) -> list[str]:
    text = log.read_text(errors="replace")
    return [line[:400] for line in text.splitlines() if any(p in line for p in patterns)]


def refused(name: str, argv: list[str]) -> dict[str, Any]:
    began = time.monotonic()
    proc = subprocess.run([*VLLM_OFFLOAD, "serve", *argv], capture_output=True, text=True)
    return {
        "case": name,
        "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - began, 2),
        "error": [line for line in proc.stderr.splitlines() if "error:" in line],
    }


def served(name: str, args: list[str], out: Path, requests: dict[str, Any]) -> dict[str, Any]:
    server = ServerProcess(serve_args=args, log_path=out / f"{name}.log")
    server.start()
    row: dict[str, Any] = {"case": name, "serve_args": args}
    try:
        row["healthy_s"] = round(server.wait_healthy(900), 1)
        row["server_rss_gib"] = round(server.host_ram_bytes() / (1 << 30), 2)
        with VllmClient(server.base_url) as client:
            for label, body in requests.items():
                began = time.monotonic()
                response = client.post(body.pop("path"), body)
                row[label] = {
                    "status": response.status_code,
                    "body": response.text[:300],
                    "seconds": round(time.monotonic() - began, 3),
                }
    except (RuntimeError, TimeoutError) as exc:
        row["failed"] = str(exc)
    finally:
        row["exit_code"] = server.stop()
    row["log"] = lines(
        server.log_path,
        "CPU tier check",
        "GPU pool :",
        "CPU tier :",
        "max_model_len",
        "KV cache size",
        "Error",
        "error:",
    )
    match = re.search(r"GPU pool : .* = ([\d,]+) tokens", "\n".join(row["log"]))
    row["gpu_pool_tokens"] = int(match.group(1).replace(",", "")) if match else None
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--out", type=Path, required=True)
    opts = parser.parse_args()
    out: Path = opts.out
    out.mkdir(parents=True, exist_ok=True)
    ids = list(range(1000, 9150))
    rows = [
        served(
            "defaults",
            [],
            out,
            {
                "completion": {
                    "path": "/v1/completions",
                    "model": "m",
                    "prompt": "Hello",
                    "max_tokens": 8,
                }
            },
        ),
        refused(
            "passthrough",
            [
                "--model",
                MODEL,
                "--gpu-kv-cache-memory-bytes",
                str(POOL_64_BLOCKS),
                "--",
                "--max-model-len",
                "8192",
                *DUMMY,
            ],
        ),
        refused(
            "passthrough-dry-run",
            [
                "--model",
                MODEL,
                "--gpu-kv-cache-memory-bytes",
                str(POOL_64_BLOCKS),
                "--dry-run",
                "--",
                "--max-model-len",
                "8192",
                *DUMMY,
            ],
        ),
        refused(
            "max-model-len-8192",
            [
                "--model",
                MODEL,
                "--gpu-kv-cache-memory-bytes",
                str(POOL_64_BLOCKS),
                "--kv-offload-cpu-tier-gib",
                "16",
                "--model-max-model-len",
                "8192",
                "--",
                *DUMMY,
            ],
        ),
        served(
            "auto-64-blocks",
            [
                "--model",
                MODEL,
                "--gpu-kv-cache-memory-bytes",
                str(POOL_64_BLOCKS),
                "--kv-offload-cpu-tier-gib",
                "16",
                "--",
                *DUMMY,
            ],
            out,
            {
                "prompt_8150": {
                    "path": "/v1/completions",
                    "model": "m",
                    "prompt": ids[:8150],
                    "max_tokens": 4,
                },
                "prompt_8000": {
                    "path": "/v1/completions",
                    "model": "m",
                    "prompt": ids[:8000],
                    "max_tokens": 16,
                },
                "prompt_64": {
                    "path": "/v1/completions",
                    "model": "m",
                    "prompt": ids[:64],
                    "max_tokens": 16,
                },
            },
        ),
    ]
    result = {"release": opts.release, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    (out / f"capacity-{opts.release}.json").write_text(json.dumps(result, indent=2) + "\n")
    json.dump(result, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
