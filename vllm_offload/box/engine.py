"""One engine of several models, as the front door starts it:
``python -m vllm_offload.box.engine SPEC.json``. It becomes vLLM's server for the launch
spec the front door prepared (``run_vllm.run``: the same checks `serve` makes), and it ends
with the front door, even one killed by SIGKILL: a pidfd watches the parent process (a
thread's exit would set off PR_SET_PDEATHSIG, and patch 0003 found the same).

An engine that sleeps starts only where vLLM will load our plugin, which makes the sleep
backend ours (vllm_ext.sleep's arena, as planned): without it vLLM would warn and fall back
to its own, which keeps more host RAM than the plan counts (issue #43). It exits 2 saying
why, before vLLM is imported; `serve` refuses the same in box.prepare."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
from pathlib import Path

from vllm_offload import launch_spec, run_vllm
from vllm_offload.errors import VllmOffloadError
from vllm_offload.vllm_ext import plugin_missing
from vllm_offload.vllm_ext.knobs import SLEEP_ARENA_ENV


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
    spec = launch_spec.LaunchSpec.from_json(json.loads(Path(argv[0]).read_text()))
    if spec.env.get(SLEEP_ARENA_ENV) == "1":
        missing = plugin_missing({**os.environ, **spec.env})
        if missing:
            print(f"vllm-offload: error: this engine sleeps, and {missing}", file=sys.stderr)
            return 2
        print(
            "vllm-offload: the plugin's entry point is registered: vLLM will load it (and "
            "with it the arena as its sleep backend)",
            file=sys.stderr,
            flush=True,
        )
    exit_with_parent()
    try:
        run_vllm.run(spec)
    except VllmOffloadError as exc:
        print(f"vllm-offload: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
