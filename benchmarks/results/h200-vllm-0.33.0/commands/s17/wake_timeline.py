# --- appended on the GPU host only by s17/layered_starts.sh to vllm_ext/layered_wake.py
# (issue #58: where the layered wake's copy time goes): for each weight allocation, the
# host's time to map it and queue its copy, and the copy's start and end on the side
# stream (events), logged at the next put-away. A copy that starts later than the one
# before it ended waited for the host (its map); one that starts at once was queued ahead.
import itertools as _itertools
import time as _time

import torch as _torch

# Appended to layered_wake.py itself: these names are the module's own, defined above.
from vllm_offload.vllm_ext import sleep as _sleep
from vllm_offload.vllm_ext.layered_wake import LayeredWakeWorker, logger

_map_and_copy, _put_away = _sleep.ArenaBackend.map_and_copy, LayeredWakeWorker.sleep
_marks: list = []


def _timed_map_and_copy(self, address, stream):
    if stream is None:
        return _map_and_copy(self, address, stream)
    side = _torch.cuda.ExternalStream(stream)
    size, before = self.held[address].size, _torch.cuda.Event(enable_timing=True)
    before.record(side)
    began = _time.perf_counter()
    _map_and_copy(self, address, stream)
    queued = _time.perf_counter()
    after = _torch.cuda.Event(enable_timing=True)
    after.record(side)
    _marks.append((size, began, queued, before, after))


def _put_away_logged(self, level=1):
    if _marks:
        _torch.cuda.synchronize()
        first, total = _marks[0][3], sum(m[0] for m in _marks)
        span = first.elapsed_time(_marks[-1][4]) / 1e3
        copying = sum(m[3].elapsed_time(m[4]) for m in _marks) / 1e3
        pairs = _itertools.pairwise(_marks)
        waited = sum(max(0.0, a[4].elapsed_time(b[3])) for a, b in pairs) / 1e3
        logger.info(
            "WAKETL %d copies, %.2f GiB: on the GPU %.3f s from the first copy's start to the "
            "last's end (%.1f GB/s), copying %.3f s (%.1f GB/s), between copies %.3f s; the "
            "host queued them in %.3f s (maps and calls %.3f s)",
            len(_marks),
            total / 2**30,
            span,
            total / span / 1e9,
            copying,
            total / copying / 1e9,
            waited,
            _marks[-1][2] - _marks[0][1],
            sum(m[2] - m[1] for m in _marks),
        )
        for size, began, queued, before, after in _marks:
            logger.info(
                "WAKETL copy %.1f MiB: host %.2f ms, starts at %.2f ms, takes %.2f ms",
                size / 2**20,
                (queued - began) * 1e3,
                first.elapsed_time(before),
                before.elapsed_time(after),
            )
        _marks.clear()
    return _put_away(self, level)


_sleep.ArenaBackend.map_and_copy = _timed_map_and_copy
LayeredWakeWorker.sleep = _put_away_logged
