"""AbridgeKV (papers/abridgekv_*.txt): learned pause tokens whose KV replace each completed block.

- :mod:`layout`: the interleaved token stream, pause tokens and RoPE positions of code rows.
- :mod:`mask`: the per-layer block mask, one predicate with a FlexAttention and a dense back end.
- :mod:`attention`: the registered attention function that gives each layer its own mask.
- :mod:`forward`: the single masked forward, per-token CE, the full-KV reference.
- :mod:`data`: prompt/response ids → streams → padded batches.
- :mod:`quotas`: uniform / per-layer quotas and the three-level allocation.
- :mod:`optim`: the paper's learning-rate schedule.
- :mod:`artifacts`: what a trained checkpoint records about its layout and quotas.
"""
