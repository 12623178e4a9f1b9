"""KVzip and KVzip+ scores of a context from materialised attention (KVzap paper §3.1-3.2).

For the KV pair of context token i in KV head h (GQA group G(h) of query heads):

    KVzip   s_i  = max_{t ∈ repeat, g ∈ G(h)} a^{(g)}_{t,i}
    KVzip+  s⁺_i = max_{t ∈ repeat, g ∈ G(h)} a^{(g)}_{t,i} · ‖W_O^{(g)} v_i‖₂ / ‖h_t‖₂

where t runs over the queries of the repeated context, a is the post-softmax attention weight,
W_O^{(g)} is query head g's column block of o_proj, v_i the value of token i, and h_t the attention
module's input (post input-norm) hidden state at query t. The product is taken before both maxima,
as in kvpress (``kvzap/data.py``), since both factors depend on g and t.

Chunking: the extended prompt is fed ``chunk_size`` tokens at a time through a DynamicCache with
eager attention, so only a (H, chunk, T) block of attention weights exists at once. Every query row
still sees exactly the keys it sees in one full forward, so the scores do not depend on the chunk
size (tested). Tokens after the repeated context are never fed. (kvpress's KVzipPress chunks the
*context* instead and renormalises attention over a subsampled key set; that approximation is not
used here.)
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from zoomr.kvzap.pretext import RepeatPretext

LOG_FLOOR = torch.finfo(torch.float32).tiny  # log(s) is taken of max(s, LOG_FLOOR)


@dataclass
class KVzipScores:
    """Scores of the context's KV pairs. Shapes: scores (L, H_kv, n); hidden (L, n, D) or None."""

    kvzip: torch.Tensor
    kvzip_plus: torch.Tensor
    hidden: torch.Tensor | None = None

    def log(self, plus: bool = True) -> torch.Tensor:
        """log(s⁺) (or log(s)), the surrogate's regression target (paper §3.3), floored at ``LOG_FLOOR``."""
        return torch.log((self.kvzip_plus if plus else self.kvzip).clamp_min(LOG_FLOOR))


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack (``model.model`` of a ``*ForCausalLM``, or the model itself)."""
    return model.model if hasattr(model, "lm_head") else model


@contextmanager
def eager_attention(model: nn.Module):
    """Temporarily switch a transformers model to eager attention (materialised weights)."""
    previous = model.config._attn_implementation
    if previous != "eager":
        model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        if previous != "eager":
            model.set_attn_implementation(previous)


def wo_value_norms(o_proj: nn.Linear, values: torch.Tensor, n_groups: int) -> torch.Tensor:
    """‖W_O^{(g)} v_i‖₂ for every query head g: values (H_kv, n, d) → (H, n) float32."""
    n_kv, _, d = values.shape
    weight = o_proj.weight.float().view(o_proj.out_features, n_kv * n_groups, d)
    out = []
    for g in range(n_kv * n_groups):
        v = values[g // n_groups].float()  # query head g reads KV head g // n_groups (repeat_kv)
        out.append((v @ weight[:, g, :].T).norm(dim=-1))
    return torch.stack(out)


class _Collector:
    """Forward hooks on every ``self_attn``: capture inputs, fold attention rows into running maxima."""

    def __init__(self, model: nn.Module, pretext: RepeatPretext, cache, keep_hidden: bool):
        cfg = model.config
        self.n_layers, self.n_heads, self.n_kv = (
            cfg.num_hidden_layers,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
        )
        self.groups = self.n_heads // self.n_kv
        self.cache, self.pretext = cache, pretext
        (self.cs, self.ce), (self.rs, self.re) = pretext.context, pretext.repeat
        n = pretext.n_context
        device = next(model.parameters()).device
        self.zip = torch.zeros(self.n_layers, self.n_heads, n, device=device)
        self.plus = torch.zeros(self.n_layers, self.n_heads, n, device=device)
        self.wov = torch.zeros(self.n_layers, self.n_heads, n, device=device)
        self.hidden = (
            torch.zeros(
                self.n_layers, n, cfg.hidden_size, dtype=next(model.parameters()).dtype, device=device
            )
            if keep_hidden
            else None
        )
        self.inputs: dict[int, torch.Tensor] = {}
        self.p0 = self.p1 = 0

    def pre_hook(self, module, args, kwargs):
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        self.inputs[module.layer_idx] = h[0]
        a, b = max(self.p0, self.cs), min(self.p1, self.ce)
        if self.hidden is not None and a < b:
            self.hidden[module.layer_idx, a - self.cs : b - self.cs] = h[0, a - self.p0 : b - self.p0]

    def post_hook(self, module, args, kwargs, output):
        layer, attn = module.layer_idx, output[1]
        if attn is None:
            raise RuntimeError("KVzip scoring needs materialised attention weights (eager attention)")
        a, b = max(self.p0, self.cs), min(self.p1, self.ce)
        if a < b:  # context tokens in this chunk: their ‖W_O^{(g)} v_i‖
            values = self.cache.layers[layer].values[0, :, a:b]
            self.wov[layer, :, a - self.cs : b - self.cs] = wo_value_norms(module.o_proj, values, self.groups)
        a, b = max(self.p0, self.rs), min(self.p1, self.re)
        if a < b:  # repeated-context queries in this chunk
            w = attn[0, :, a - self.p0 : b - self.p0, self.cs : self.ce].float()  # (H, rows, n)
            h_norm = self.inputs[layer][a - self.p0 : b - self.p0].float().norm(dim=-1)  # (rows,)
            self.zip[layer] = torch.maximum(self.zip[layer], w.amax(dim=1))
            w = w * self.wov[layer][:, None, :] / h_norm[None, :, None]
            self.plus[layer] = torch.maximum(self.plus[layer], w.amax(dim=1))
        return output

    def group_max(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(self.n_layers, self.n_kv, self.groups, -1).amax(dim=2)


@torch.no_grad()
def kvzip_scores(
    model: nn.Module, pretext: RepeatPretext, chunk_size: int = 512, keep_hidden: bool = False
) -> KVzipScores:
    """KVzip and KVzip+ scores of ``pretext``'s context (batch of one), optionally with its hidden states."""
    from transformers import DynamicCache

    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    decoder = decoder_of(model)
    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    col = _Collector(model, pretext, cache, keep_hidden)
    handles = []
    for layer in decoder.layers:
        handles.append(layer.self_attn.register_forward_pre_hook(col.pre_hook, with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(col.post_hook, with_kwargs=True))
    ids = pretext.input_ids.to(device)
    try:
        with eager_attention(model):
            for p0 in range(0, col.re, chunk_size):
                col.p0, col.p1 = p0, min(p0 + chunk_size, col.re)
                decoder(input_ids=ids[:, col.p0 : col.p1], cache=cache, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    return KVzipScores(
        kvzip=col.group_max(col.zip).cpu(),
        kvzip_plus=col.group_max(col.plus).cpu(),
        hidden=col.hidden.cpu() if col.hidden is not None else None,
    )
