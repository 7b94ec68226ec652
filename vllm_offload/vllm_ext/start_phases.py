"""What a person sees while vLLM starts (issue #56): a first start compiles the model for
minutes and vLLM's own lines say so only in passing, while its "No available shared
memory broadcast block found in 60 seconds ... some processes are hanging" reads like a
hang during that compile. The plugin installs both in each vLLM process: a line per
phase of the start (once each), and that warning said for what it is."""

from __future__ import annotations

import logging
import sys
import time

COMPILING = (
    "compiling the model: the first start of a model and its settings takes minutes (~2 on "
    "a 2-core CPU host), later starts read the compile cache"
)
# vLLM's message (the start of its template) -> what the phase is, for a person (0.32 on
# CPU warms up for its compile; 0.33 on CUDA logs each compile range).
PHASES = (
    ("Starting to load model", "loading the weights"),
    ("Loading weights took", "weights loaded"),
    ("Warming up model for the compilation", COMPILING),
    ("%sCompiling a graph for", COMPILING),
    ("%sDirectly load the compiled graph", "the compiled model read from the cache"),
    ("Graph capturing finished", "CUDA graphs captured"),
    ("init engine (profile, create kv cache, warmup model) took", "the engine is ready"),
)
SHM_LOGGER = "vllm.distributed.device_communicators.shm_broadcast"
SHM_WAIT = "No available shared memory broadcast block found"
SHM_SAID = (
    "(vllm-offload) no step from the engine for %d s: it is busy (a first start compiles "
    "the model, ~2 min on a 2-core CPU host) or, if this goes on after start-up, stuck"
)


class Phases(logging.Handler):
    """Prints each phase of the start once, with the seconds since this process began."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.began = time.monotonic()
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        template = str(record.msg)
        for start, phase in PHASES:
            if template.startswith(start) and phase not in self.seen:
                self.seen.add(phase)
                took = time.monotonic() - self.began
                print(f"vllm-offload: start: {phase} ({took:.0f} s)", file=sys.stderr, flush=True)


class SaidForWhatItIs(logging.Filter):
    """vLLM's shared-memory wait, said without 'hanging' as the first guess."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(SHM_WAIT):
            record.msg = SHM_SAID
        return True


def install() -> None:
    """Once per process (the plugin's register() may run more than once)."""
    vllm = logging.getLogger("vllm")
    if not any(isinstance(h, Phases) for h in vllm.handlers):
        vllm.addHandler(Phases())
    shm = logging.getLogger(SHM_LOGGER)
    if not any(isinstance(f, SaidForWhatItIs) for f in shm.filters):
        shm.addFilter(SaidForWhatItIs())
