"""Sleeps 50 ms at a time and prints each wake that came over 0.5 s late, with the CPU
pressure the kernel reports (the line behind ticker-during-wedge-test.log)."""

import time
from pathlib import Path

last = time.monotonic()
while True:
    time.sleep(0.05)
    now = time.monotonic()
    if now - last > 0.5:
        psi = Path("/proc/pressure/cpu").read_text().split("\n")[0]
        print(f"TICK {time.time():.1f} late {now - last:.2f}s | {psi}", flush=True)
    last = now
