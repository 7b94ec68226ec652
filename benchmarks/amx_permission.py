"""Does an AMX tile instruction need the kernel's permission in each process? (issue #28)

Runs one AMX tile instruction (ldtilecfg, tilezero, tilerelease) in fresh Python processes
and prints how each ended, as JSON:
  no_request       a fresh process (as vLLM's spawned CPU worker is), nobody asked
  after_request    the same after vllm_offload.vllm_ext.amx.request_permission()
                   (what the plugin does)
  after_torch      the same after torch.cpu._init_amx() (what torch's inductor does)
  spawned_child    a child spawned (execve) by a process that had asked
  forked_child     a child forked by a process that had asked
Exit code -4 is SIGILL. Needs an x86-64 Linux host whose CPU reports amx_tile to say
anything; elsewhere every case ends in SIGILL (no AMX) and the JSON says the CPU has none.
  python3 benchmarks/amx_permission.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# x86-64 machine code, called as void f(void *tile_config): ldtilecfg [rdi]; tilezero tmm0;
# tilerelease; ret.
TILE_CODE = "C4E27849 07 C4E27B49C0 C4E27849C0 C3".replace(" ", "")
RUN_TILE = f"""
import ctypes, mmap
code = bytes.fromhex({TILE_CODE!r})
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
config = (ctypes.c_ubyte * 64)()
config[0] = 1          # palette 1
config[16] = 64        # tile 0: 64 bytes a row
config[48] = 16        # tile 0: 16 rows
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
ctypes.CFUNCTYPE(None, ctypes.c_void_p)(address)(ctypes.addressof(config))
print("tile instruction ran")
"""
ASK = (
    "from vllm_offload.vllm_ext.amx import request_permission\n"
    "print('asked:', request_permission(), flush=True)\n"
)
TORCH = "import torch; print('torch init_amx:', torch.cpu._init_amx(), flush=True)\n"
CHILD = (
    "import multiprocessing as mp, sys\n"
    "from vllm_offload.vllm_ext.amx import request_permission\n"
    f"TILE = {RUN_TILE!r}\n"
    "def run():\n"
    "    exec(TILE)\n"
    "if __name__ == '__main__':\n"
    "    print('asked:', request_permission(), flush=True)\n"
    "    p = mp.get_context(sys.argv[1]).Process(target=run)\n"
    "    p.start(); p.join(); print('child exit', p.exitcode)\n"
    "    sys.exit(0 if p.exitcode == 0 else 1)\n"
)


def run(code: str, *args: str) -> dict[str, object]:
    """``code`` in a fresh interpreter (from a file: spawn re-imports its main module)."""
    script = Path("/tmp/amx_permission_case.py")
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(HERE.parent)},
    )
    return {
        "exit": done.returncode,
        "out": done.stdout.strip()[-300:],
        "err": done.stderr.strip()[-300:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from vllm_offload.vllm_ext import amx

    cpuinfo = amx.read_cpuinfo()
    flags = amx.cpu_flags(cpuinfo)
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in cpuinfo.splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    result: dict[str, object] = {
        "cpu": model,
        "flags": sorted(f for f in flags if f.startswith(("amx", "avx512_fp16", "avx512_bf16"))),
        "no_request": run(RUN_TILE),
        "after_request": run(ASK + RUN_TILE),
        "after_torch": run(TORCH + RUN_TILE),
        "spawned_child": run(CHILD, "spawn"),
        "forked_child": run(CHILD, "fork"),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
