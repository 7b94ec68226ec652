#!/usr/bin/env python3
"""How fast a CPU KV tier's pages can be populated (issue #16: on the H200, vLLM 0.32.0
spends ~17 s of a 40 GiB tier's 18.7 s set-up in MADV_POPULATE_WRITE of its /dev/shm
region, from one thread). Populates a fresh /dev/shm file of --gib GiB in 32 MiB chunks,
as vLLM does, with 1 thread and with several (madvise through ctypes releases the GIL),
arms interleaved, and writes the seconds and GB/s of each.

    benchmarks/tier_populate.py --gib 40 --threads 1,4,8,16 --repeats 2 --out OUT.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MADV_POPULATE_WRITE = 23  # Linux 5.14+
CHUNK = 32 << 20
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def populate(size: int, threads: int) -> float:
    path = f"/dev/shm/tier-populate-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        region = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        anchor = ctypes.c_char.from_buffer(region)  # exports the buffer: released below
        base = ctypes.addressof(anchor)

        def one(offset: int) -> None:
            if LIBC.madvise(base + offset, min(CHUNK, size - offset), MADV_POPULATE_WRITE):
                raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE) failed")

        began = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(0, size, CHUNK)))
        seconds = time.perf_counter() - began
        del anchor
        region.close()
        return seconds
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=40)
    parser.add_argument("--threads", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    size = int(args.gib * (1 << 30)) // CHUNK * CHUNK
    arms = [int(t) for t in args.threads.split(",")]
    seconds: dict[int, list[float]] = {t: [] for t in arms}
    for repeat in range(args.repeats):
        for threads in arms:
            seconds[threads].append(populate(size, threads))
            print(
                f"repeat {repeat + 1} threads {threads:2d}: {seconds[threads][-1]:.2f} s",
                flush=True,
            )
    rows = [
        {
            "threads": t,
            "seconds": s,
            "median_s": statistics.median(s),
            "gb_per_s": round(size / statistics.median(s) / 1e9, 2),
        }
        for t, s in seconds.items()
    ]
    args.out.write_text(
        json.dumps({"gib": args.gib, "cpus": os.cpu_count(), "rows": rows}, indent=2) + "\n"
    )
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
