"""KVzap (papers/kvzap_*.txt): KVzip/KVzip+ oracle scores, surrogate models and their checkpoints.

- :mod:`zoomr.kvzap.pretext`: the KVzip repeat pretext (paper §3.1), built from token ids.
- :mod:`zoomr.kvzap.scoring`: KVzip and KVzip+ scores (§3.1-3.2) from materialised attention, chunked.
- :mod:`zoomr.kvzap.surrogate`: the per-layer surrogates (§3.3) in NVIDIA/kvpress's checkpoint format.
- :mod:`zoomr.kvzap.fit`: ridge and MLP fitting, R² per head (§4.1).
- :mod:`zoomr.kvzap.pairs`: sharded (h, log s⁺) training pairs on disk and their manifest.
- :mod:`zoomr.kvzap.flops`: analytic surrogate / model linear-layer FLOPs (Appendix B).
"""
