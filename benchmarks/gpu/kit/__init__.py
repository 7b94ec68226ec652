"""The GPU experiments' library (benchmarks/gpu/README.md says how to add an experiment):

- ``model``: the model an experiment serves (a config.json shape, a made-up word-level
  tokenizer so that vLLM returns logprobs, a random checkpoint of deviation 0.02) and the
  pool split patch 0006 logs;
- ``arms``: one `vllm-offload serve` per arm, all started at once, each with its own
  compile cache (cold or shared), stopped together;
- ``stream``: one streamed greedy request with each token's arrival, its logprobs, and the
  tail a user feels (mean time per token, p99 and the worst gap); two answers compared;
- ``record``: the JSON an experiment writes as it goes (options, arms, results);
- ``options``: the command line's shared knobs (``--out``, pools, lengths), each named once;
- ``link``: the host link's measured rate and the bytes staged prefill copies over it;
- ``checkpoint``: a random safetensors checkpoint of a config's shape (random_checkpoint.py
  is its command line); ``vlm``: the files a random Qwen2.5-VL needs to serve images;
- ``box``: a box of several models (two [[models]] of one checkpoint) served, its
  token-id prompts, a first token, and the front door's control socket.
- ``chat_ratios``: chats beside a long request against the same chats alone (each
  chat's ratios, its medians over runs, the yardstick's own noise, the tails).

``stream.stream_record`` and ``compare_records`` keep the earlier experiments' JSON keys
(TTFT, total, median and min-max gap) over the same streamed request.

Scripts import it as ``kit`` (they put their own folder on sys.path); nothing here imports
tests.
"""
