"""Full KV cache on the device: every row kept (the reference arm; byte and time ratios are against it)."""

from __future__ import annotations

from zoomr.cache.base import PolicyCache
from zoomr.cache.registry import register_policy
from zoomr.schemas.cache import FullConfig


@register_policy("full", config=FullConfig)
class FullCache(PolicyCache):
    """Keeps everything; exists so that every arm runs through the same storage, attention and engine."""
