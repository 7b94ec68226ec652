# --- appended on the GPU host only by s14/fair10.sh, after s13/step_log.py: when each
# request reaches the scheduler (vLLM's input thread made its Request and hashed its
# blocks before), in vLLM's clock as the chats' "began_s" (CLOCK_MONOTONIC).
import time as _time

# Appended to fair_scheduler.py itself: these names are the module's own, defined above.
from vllm_offload.vllm_ext.fair_scheduler import FairScheduler, logger

_add = FairScheduler.add_request


def _logged_add(self, request):
    began = _time.monotonic()
    _add(self, request)
    logger.info(
        "STEPLOG add %s at %.4f tokens %d", request.request_id, began, request.num_prompt_tokens
    )


FairScheduler.add_request = _logged_add
