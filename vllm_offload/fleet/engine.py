"""One engine of several models, as the front door starts it:
``python -m vllm_offload.fleet.engine SPEC.json``. It becomes vLLM's server for the launch
spec the front door prepared (``run_vllm.run``: the same checks `serve` makes), and it ends
with the front door, even one killed by SIGKILL: a pidfd watches the parent process (a
thread's exit would set off PR_SET_PDEATHSIG, and patch 0003 found the same)."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
from pathlib import Path

from vllm_offload import launch, run_vllm
from vllm_offload.errors import VllmOffloadError


def exit_with_parent() -> None:
    """SIGTERM this process (vLLM's own shutdown) once its parent process has ended."""
    try:
        pidfd = os.pidfd_open(os.getppid())
    except ProcessLookupError:  # gone already
        os.kill(os.getpid(), signal.SIGTERM)
        return

    def wait() -> None:
        select.select([pidfd], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="exit-with-front-door", daemon=True).start()


def main(argv: list[str]) -> int:
    spec = launch.LaunchSpec.from_json(json.loads(Path(argv[0]).read_text()))
    exit_with_parent()
    try:
        run_vllm.run(spec)
    except VllmOffloadError as exc:
        print(f"vllm-offload: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
