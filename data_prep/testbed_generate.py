"""Greedy generation of testbed responses with ``model.generate`` (full KV only).

The project's decode engine (``zoomr.engine``) is the evaluation path for every KV policy; this
helper is the stand-in for full KV while it is missing and a cross-check of it afterwards (greedy
decoding with full KV must give the same text through both).
"""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from data_prep import testbed_tokenizer as tt
from zoomr import tokens


def prompt_ids(record: dict[str, Any], enc: tt.FastEncoder) -> list[int]:
    return enc.prompt(record["prompt"].split())


def stop_ids(tokenizer) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(tokens.IM_END), tokenizer.eos_token_id]


@torch.no_grad()
def hf_greedy(model, tokenizer, records: list[dict[str, Any]], max_new_tokens: int, batch_size: int = 16) -> list[str]:
    """Responses (special tokens kept) for ``records``, greedy, left-padded batches."""
    enc = tt.FastEncoder(tokenizer)
    pad = tokenizer.pad_token_id
    out: list[str] = []
    for i in tqdm(range(0, len(records), batch_size), desc="greedy (hf generate)"):
        chunk = [prompt_ids(r, enc) for r in records[i : i + batch_size]]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunk])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk])
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=stop_ids(tokenizer),
            pad_token_id=pad,
        )
        out += tokenizer.batch_decode(gen[:, width:], skip_special_tokens=False)
    return out
