"""LightThinker (zjunlp/LightThinker; METHODS.md "Baselines"): thoughts compressed into n cache tokens.

- :mod:`layout`: thought segmentation, the splitter / cache / continue tokens, the training stream.
- :mod:`mask`: the thought mask on the project's block-mask machinery (:mod:`zoomr.abridge.mask`).
- :mod:`parity`: the trainer's masked forward vs the serving policy (:mod:`zoomr.cache.lightthinker`).
- :mod:`data`: dataset examples → streams.
"""
