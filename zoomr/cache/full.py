"""Full KV cache on the device: every row kept (the reference arm; byte and time ratios are against it)."""

from __future__ import annotations

from dataclasses import dataclass

from zoomr.cache.base import PolicyCache
from zoomr.cache.config import PolicyConfig
from zoomr.cache.registry import register_policy


@dataclass
class FullConfig(PolicyConfig):
    """Full KV cache on the device (the reference every other policy is measured against)."""


@register_policy("full", FullConfig)
class FullCache(PolicyCache):
    """Keeps everything; exists so that every arm runs through the same storage, attention and engine."""
