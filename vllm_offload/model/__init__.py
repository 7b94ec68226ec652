"""What a model is, read from its files (each one untrusted input) or the hub:

- ``facts``: a model directory's facts for the planner (its fingerprint, KV kinds, parts);
- ``config_json``: config.json's fields as values in ranges, each layer's KV kind;
- ``parts``: its components (vision/audio tower, projector, language model) and their bytes;
- ``vision``: a vision encoder's shape and the largest image vLLM profiles it with;
- ``safetensors_header``: a safetensors header, bounded;
- ``weight_estimate``: a checkpoint's weight bytes from config.json alone;
- ``limit``: the longest max_model_len vLLM accepts for it;
- ``hub``, ``hub_guard``: a model on the Hugging Face hub, and what the hub may answer
  before the library writes a path from it;
- ``demo``, ``real``: the default model (SmolLM2-135M-Instruct converted from a pinned GGUF).
"""
