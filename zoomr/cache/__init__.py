"""KV-cache policies: one interface (:mod:`zoomr.cache.base`), one file per policy, a registry.

``build_policy(cfg.method, model.config, tokenizer)`` returns a fresh ``transformers.Cache`` for one batch.
"""

from zoomr import attention as _attention  # noqa: F401  (registers attn_implementation="zoomr")
from zoomr.cache.base import ForcedInput, PolicyCache, PolicyLayer, Step
from zoomr.cache.registry import (
    POLICIES,
    build_policy,
    has_row_budget,
    match_budget,
    policy_class,
    policy_config,
    register_policy,
)
from zoomr.cache.store import PagedKV, Rows

__all__ = [
    "POLICIES",
    "ForcedInput",
    "PagedKV",
    "PolicyCache",
    "PolicyLayer",
    "Rows",
    "Step",
    "build_policy",
    "has_row_budget",
    "match_budget",
    "policy_class",
    "policy_config",
    "register_policy",
]
