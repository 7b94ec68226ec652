"""The vLLM we pin, seen from outside it (nothing here imports vLLM):

- ``version``: which vLLM is installed, read from its files;
- ``patching``, ``patch_journal``, ``unified_diff``, ``site_files``: the patch series
  (``vllm_offload/patches/``) applied all or nothing into a site-packages;
- ``compat``: the seed's old names;
- ``client``: the one HTTP client for a vLLM server; ``metrics``: vLLM's metric names, once.

A new vLLM release touches this wing first (``vllm_offload/patches/README.md``).
"""
