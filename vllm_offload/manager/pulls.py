"""Downloads the manager's API started (a hub id the file's manager.hub_models allows):
one at a time, in a thread, into the manager's HF cache (its unit's HOME is the state
directory, as the server's), each with its progress for the page to poll."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from vllm_offload.errors import Refused, VllmOffloadError
from vllm_offload.model import hub

KEPT = 20  # finished downloads the page still lists


@dataclass(kw_only=True)
class Pull:
    model: str  # the id as given (org/name[@revision])
    state: Literal["fetching", "done", "failed"] = "fetching"
    fetched_bytes: int = 0
    total_bytes: int = 0  # grows as files start
    message: str = ""  # done: the folder; failed: why
    started: float = 0.0


class Pulls:
    def __init__(self) -> None:
        self._pulls: list[Pull] = []
        self._lock = threading.Lock()

    def start(self, ref: hub.HubRef) -> dict[str, Any]:
        """Start fetching ``ref`` (the one running, if it is that one); Refused (409)
        while another download runs."""
        with self._lock:
            running = next((p for p in self._pulls if p.state == "fetching"), None)
            if running is not None and running.model != str(ref):
                raise Refused("model", f"{running.model} is downloading; one at a time")
            if running is not None:
                return asdict(running)
            pull = Pull(model=str(ref), started=round(time.time(), 1))
            self._pulls = [*self._pulls[-KEPT:], pull]
        threading.Thread(target=self._fetch, args=(ref, pull), name="hub-pull", daemon=True).start()
        return asdict(pull)

    def _fetch(self, ref: hub.HubRef, pull: Pull) -> None:
        def progress(fetched: int, total: int) -> None:
            pull.fetched_bytes, pull.total_bytes = fetched, max(total, fetched)

        try:
            folder = hub.pull(ref, progress)
        except VllmOffloadError as exc:
            pull.state, pull.message = "failed", exc.message
            return
        except Exception as exc:  # a bug or the disk: say it on the page, keep the manager
            pull.state, pull.message = "failed", f"{type(exc).__name__}: {str(exc)[:300]}"
            return
        pull.state, pull.message = "done", str(folder)

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(p) for p in self._pulls]
