"""The disk tier behind the CPU tier: vLLM 0.32's filesystem tier, bounded.

vLLM's ``fs`` secondary tier (``vllm.v1.kv_offload.tiering.fs``) writes one file per
chunk under a root directory and never deletes one, so files pile up until the disk is
full. ``BoundedFsTier`` is that tier with a budget: the files under ``budget_root`` (every
model's, so switching models does not leak space) never exceed ``max_bytes``, the
filesystem keeps ``min_free_bytes`` free, and the least recently used files go first (a
load counts as a use). It plugs in through vLLM's own out-of-tree tier hook
(``"type": "BoundedFsTier", "module_path": "vllm_offload.vllm_ext.disk_tier"`` in
``secondary_tiers``), so no vLLM code is changed and no upstream code is copied.

Eviction can race a lookup (a file found, then deleted before it is read): the load
then fails, and vLLM's fs tier marks those blocks a miss and recomputes them. Wrong KV is
never served. This module runs inside vLLM's scheduler process; it imports vLLM.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vllm.logger import init_logger
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from vllm_offload import disk_layout
from vllm_offload.disk_layout import PARTIAL_FILE, block_files

logger = init_logger(__name__)

STATUS_EVERY_S = 5.0  # how often the tier's account for the manager's page is rewritten
# Past its budget the tier evicts down to this share of it, so the unlinks (on a thread of
# their own) have room to lag without the disk holding more than the budget.
LOW_WATER = 0.9


class DiskBudget:
    """Block files by recency with their sizes; evicts the least recent to stay in bounds.
    Files of stores in flight are counted (so the bound holds while they are written) and
    never evicted. The accounting runs on vLLM's scheduler thread; the file system calls
    (unlink, and the mtime a read leaves) run on one thread of their own: on the H200 host
    unlinking on the scheduler thread (an ext4 mount with online discard) added ~180 ms to
    the TTFT of a request that made room."""

    def __init__(self, root: Path, max_bytes: int, min_free_bytes: int) -> None:
        self.root, self.max_bytes, self.min_free_bytes = root, max_bytes, min_free_bytes
        self.files: OrderedDict[str, int] = OrderedDict()
        self.used_bytes = 0
        self.evicted_bytes = 0
        self.writing: set[str] = set()
        # Evicted but not yet unlinked: the filesystem will have this much more free.
        self._unlinking_bytes = 0
        self._lock = threading.Lock()
        self._chores: queue.Queue[tuple[str, int]] = queue.Queue()
        self.report: Callable[[], None] | None = None  # called every STATUS_EVERY_S or so
        threading.Thread(target=self._do_chores, name="disk-tier-unlink", daemon=True).start()
        found = []
        for entry in block_files(root):
            if PARTIAL_FILE.fullmatch(entry.name):  # a write a crash cut short
                Path(entry.path).unlink(missing_ok=True)
                continue
            stat = entry.stat(follow_symlinks=False)
            found.append((stat.st_mtime_ns, entry.path, stat.st_size))
        for _, path, size in sorted(found):  # oldest first: evicted first
            self.files[path] = size
            self.used_bytes += size
        self.evict()

    def _do_chores(self) -> None:
        reported = 0.0
        while True:
            with contextlib.suppress(queue.Empty):
                self._do_chore(*self._chores.get(timeout=STATUS_EVERY_S))
            if self.report is not None and time.monotonic() - reported >= STATUS_EVERY_S:
                reported = time.monotonic()
                with contextlib.suppress(Exception):  # this thread must outlive a bad report
                    self.report()

    def _do_chore(self, path: str, size: int) -> None:
        with contextlib.suppress(OSError):
            if size and path not in self.files:  # evicted (and not stored again since)
                os.unlink(path)
            else:  # read: record the use for the next start
                os.utime(path)
        with self._lock:
            self._unlinking_bytes -= size
        self._chores.task_done()

    def settle(self) -> None:
        """Wait until every eviction has left the disk (tests, shutdown)."""
        self._chores.join()

    def add(self, paths: Iterable[str], size: int) -> None:
        """Files about to be written (counted now, protected until ``written``)."""
        for path in paths:
            self.used_bytes += size - self.files.pop(path, 0)
            self.files[path] = size
            self.writing.add(path)
        self.evict()

    def written(self, paths: Iterable[str], ok: bool) -> None:
        for path in paths:
            self.writing.discard(path)
            if not ok and not os.path.exists(path):
                self.used_bytes -= self.files.pop(path, 0)

    def touch(self, paths: Iterable[str]) -> None:
        """Files being read: the most recently used now (their mtime says so to the next
        start, which orders what it finds by mtime)."""
        for path in paths:
            if path in self.files:
                self.files.move_to_end(path)
                self._chores.put((path, 0))

    def evict(self) -> None:
        """Past the budget, evict the least recently used files down to LOW_WATER of it, and
        as many as the free-space reserve needs (files being written excepted). The disk
        holds the files counted plus those not yet unlinked: should the unlink thread fall
        that far behind, this thread unlinks too, so the bound holds on disk."""
        with self._lock:
            free = shutil.disk_usage(self.root).free + self._unlinking_bytes
        free -= sum(self.files[path] for path in self.writing)  # about to be written
        short = max(0, self.min_free_bytes - free)
        target = (
            self.max_bytes if self.used_bytes <= self.max_bytes else int(self.max_bytes * LOW_WATER)
        )
        victims, freed, used = [], 0, self.used_bytes
        for path, size in self.files.items():  # oldest first; stops as soon as it may
            if used <= target and freed >= short:
                break
            if path not in self.writing:
                victims.append(path)
                used, freed = used - size, freed + size
        for path in victims:
            size = self.files.pop(path)
            self.used_bytes -= size
            self.evicted_bytes += size
            with self._lock:
                self._unlinking_bytes += size
            self._chores.put((path, size))
        while self.used_bytes + self._unlinking_bytes > self.max_bytes:
            try:
                self._do_chore(*self._chores.get_nowait())
            except queue.Empty:
                break


class BoundedFsTier(FileSystemTierManager):
    """vLLM's filesystem tier within ``max_bytes`` under ``budget_root`` and a free-space
    reserve of ``min_free_bytes``; least recently used files go first."""

    def __init__(
        self, *, budget_root: str, max_bytes: int, min_free_bytes: int, **kwargs: Any
    ) -> None:
        # In use from before the first file is written until this process ends: `cache
        # clear` refuses meanwhile.
        self._in_use = disk_layout.hold(Path(budget_root))
        super().__init__(**kwargs)
        began = time.monotonic()
        self.budget = DiskBudget(Path(budget_root), int(max_bytes), int(min_free_bytes))
        self._stores: dict[Any, list[str]] = {}
        self._write_status()
        self.budget.report = self._write_status  # from the unlink thread, every few seconds
        logger.info(
            "Disk tier at %s: %.2f of %.2f GiB used by %d files from before (read in %.1f s)",
            budget_root,
            self.budget.used_bytes / (1 << 30),
            int(max_bytes) / (1 << 30),
            len(self.budget.files),
            time.monotonic() - began,
        )

    def _paths(self, job: TransferJob) -> list[str]:
        return [self.file_mapper.get_file_name(key) for key in job.keys]

    def submit_store(self, job_metadata: TransferJob) -> None:
        paths = self._paths(job_metadata)
        self.budget.add(paths, self._block_size)
        self._stores[job_metadata.job_id] = paths
        super().submit_store(job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self.budget.touch(self._paths(job_metadata))
        super().submit_load(job_metadata)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = list(super().get_finished_jobs())
        for result in results:
            if (paths := self._stores.pop(result.job_id, None)) is not None:
                self.budget.written(paths, result.success)
        return results

    def shutdown(self) -> None:
        super().shutdown()
        self.budget.settle()
        self._write_status()

    def _write_status(self) -> None:
        with contextlib.suppress(OSError):  # the page's figure, never worth a failure
            disk_layout.write_status(
                self.budget.root,
                {
                    "used_bytes": self.budget.used_bytes,
                    "max_bytes": self.budget.max_bytes,
                    "files": len(self.budget.files),
                    "evicted_bytes": self.budget.evicted_bytes,
                },
            )
