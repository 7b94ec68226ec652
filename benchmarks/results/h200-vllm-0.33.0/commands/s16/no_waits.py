# --- appended on the GPU host only by s16/layered.sh to vllm_ext/plugin.py (imported in
# every process of a server that loads the plugin): the control arm of the layered wake,
# whose first step waits for no copy (BENCH_LAYERED_NO_WAITS=1): its answers must move.
import os as _os

if _os.environ.get("BENCH_LAYERED_NO_WAITS") == "1":
    from vllm_offload.vllm_ext import layered_wake as _layered_wake

    _layered_wake._current_stream_waits = lambda event: None
