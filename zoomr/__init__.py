"""zoomr: the core library (models, KV-cache policies, segments, memory accounting).

Library code takes plain arguments; it never reads Hydra state.
"""

__version__ = "0.1.0"
