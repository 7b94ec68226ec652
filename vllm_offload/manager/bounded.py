"""Work on files someone else may have planted (a model folder, the disk tier) within a
time bound. Such reads are checked (regular files only, capped: safe_files), but a file
on a stalled filesystem can still hang one; the request then answers, and at most
``MAX_STUCK`` threads can ever be held, never the server's own pool."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from vllm_offload.errors import Refused

T = TypeVar("T")
MAX_STUCK = 4
TIMEOUT_S = 20.0
_slots = threading.BoundedSemaphore(MAX_STUCK)


def call(work: Callable[[], T], field: str, what: str, timeout_s: float = TIMEOUT_S) -> T:
    """``work()`` in a daemon thread of its own (one that never ends cannot keep the
    process from exiting); Refused (409) naming ``field`` if it takes over ``timeout_s``
    or MAX_STUCK earlier ones are still running."""
    too_slow = Refused(
        field,
        f"{what} took over {timeout_s:.0f} s (a file that does not "
        "answer: a hung filesystem?); check it, then try again",
    )
    if not _slots.acquire(timeout=timeout_s):
        raise too_slow
    outcome: list[T] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # handed to the caller
            failure.append(exc)
        finally:
            _slots.release()
            done.set()

    threading.Thread(target=run, name=f"bounded: {what}", daemon=True).start()
    if not done.wait(timeout_s):
        raise too_slow
    if failure:
        raise failure[0]
    return outcome[0]
