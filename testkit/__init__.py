"""What the tests and the benchmarks share (the checkout's own; not shipped in the wheel):

- ``server``: a real vLLM server process started through vllm-offload;
- ``stack``: the deployment the browser tests drive (units under systemctl3, the manager);
- ``real_reference``: the default model's float32 transformers reference and the rule
  that compares a server's greedy answer with it;
- ``residency_clock``: simulated time for the switcher and an engine timed on it.

Benchmarks and tests import from here and from the package; a benchmark never imports
``tests`` (tests/test_repository.py says so).
"""
