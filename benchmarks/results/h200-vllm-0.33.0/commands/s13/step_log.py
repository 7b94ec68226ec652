# --- appended on the GPU host only by s13/steplog.sh (issue #54: where a long step's time
# goes): each step's scheduling and end, the share's bookkeeping, and the executor's time.
import time as _time

from vllm.v1.executor.uniproc_executor import UniProcExecutor as _Executor

# Appended to fair_scheduler.py itself: these names are the module's own, defined above.
from vllm_offload.vllm_ext.fair_scheduler import FairScheduler, logger
from vllm_offload.vllm_ext.spill_share import SpillShare as _Share

_schedule, _update, _ended = FairScheduler.schedule, FairScheduler.update_from_output, _Share.ended
_execute = _Executor.execute_model


def _logged_schedule(self, *args, **kwargs):
    began = _time.monotonic()
    out = _schedule(self, *args, **kwargs)
    longs = [r for r in self.requests.values() if self.is_long(r)]
    if longs:
        mine = {i: n for i, n in out.num_scheduled_tokens.items() if self.is_long(self.requests[i])}
        logger.info(
            "STEPLOG sched %x at %.4f took %.4f long %s of %d reqs; not_before %.4f; in flight %s",
            id(out),
            began,
            _time.monotonic() - began,
            mine,
            len(out.num_scheduled_tokens),
            self.spill_share._not_before,
            [(s.spilled, s.shared) for s in self.spill_share._running],
        )
    return out


def _logged_update(self, scheduler_output, *args, **kwargs):
    now = _time.monotonic()
    if any(self.is_long(r) for r in self.requests.values()):
        logger.info("STEPLOG end %x at %.4f", id(scheduler_output), now)
    return _update(self, scheduler_output, *args, **kwargs)


def _logged_ended(self, key):
    found = [s for s in self._running if s.key is key]
    last, now = self._last_end, self.clock()
    _ended(self, key)
    if found and found[0].spilled:
        step = found[0]
        logger.info(
            "STEPLOG spilled %x scheduled %.4f ended %.4f last_end %.4f took %.4f not_before %.4f",
            id(key),
            step.at,
            now,
            last,
            now - max(step.at, last),
            self._not_before,
        )


def _logged_execute(self, scheduler_output, non_block=False):
    began = _time.monotonic()
    out = _execute(self, scheduler_output, non_block)
    spent = _time.monotonic() - began
    if spent > 0.01:
        logger.info("STEPLOG execute %x at %.4f took %.4f", id(scheduler_output), began, spent)
    return out


FairScheduler.schedule = _logged_schedule
FairScheduler.update_from_output = _logged_update
_Share.ended = _logged_ended
_Executor.execute_model = _logged_execute
