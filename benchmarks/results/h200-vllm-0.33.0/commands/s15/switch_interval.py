# --- appended on the GPU host only by s15/switch.sh to vllm_ext/plugin.py (imported in
# every process of a server that loads the plugin): Python's switch interval from the
# arm's environment (fairness.py --switch-intervals), where set.
import os as _os
import sys as _sys

if _os.environ.get("BENCH_SWITCH_INTERVAL_S"):
    _sys.setswitchinterval(float(_os.environ["BENCH_SWITCH_INTERVAL_S"]))
