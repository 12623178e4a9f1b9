"""ZoomR delimiter SFT (``+method=zoomr_sft``, ZoomR §3.2): the SFT of :func:`zoomr.sft.train_sft` plus

- the summary delimiters as special tokens (added and embeddings resized when the tokenizer lacks them;
  new rows start at the mean embedding, transformers' default);
- their input-embedding and output-head rows trainable next to LoRA (PEFT ``trainable_token_indices``;
  with tied embeddings the head follows the embedding), every other row frozen;
- a check that the data really carries summaries (the ``data_prep +pipeline=summarize`` output).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from zoomr import tokens
from zoomr.entry import to_plain
from zoomr.schemas import to_dataclass
from zoomr.schemas.zoomr import ZoomRSFTMethod
from zoomr.sft import train_sft
from zoomr.training import load_sft_dataset

log = logging.getLogger(__name__)


def ensure_tokens(model, tokenizer, names: list[str]) -> list[int]:
    """Add missing special tokens, grow the embeddings if needed; return the tokens' ids."""
    missing = [t for t in names if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": missing}, replace_extra_special_tokens=False
        )
        log.info("added special tokens %s", missing)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    return tokenizer.convert_tokens_to_ids(names)


def embedding_module_names(model) -> tuple[str, str | None]:
    """Names of the input embedding and (when untied) the output head, as PEFT matches them."""
    emb = model.get_input_embeddings()
    out = model.get_output_embeddings()
    names = {m: n.rsplit(".", 1)[-1] for n, m in model.named_modules()}
    tied = out is not None and out.weight is emb.weight
    return names[emb], None if tied or out is None else names[out]


def trainable_token_indices(model, ids: list[int]) -> dict[str, list[int]]:
    emb, head = embedding_module_names(model)
    return {emb: list(ids), **({head: list(ids)} if head else {})}


def expose_head_bias(model) -> None:
    """Let TRL's fused LM-head loss read ``lm_head.bias`` through PEFT's trainable-tokens wrapper.

    TRL 1.16 computes the loss from ``lm_head.weight`` and ``lm_head.bias``; the wrapper forwards
    ``weight`` (with the trainable rows merged in, differentiably) but raises on ``bias``.
    """
    head = model.get_base_model().get_output_embeddings()
    try:
        head.bias  # noqa: B018
    except AttributeError:
        base_bias = getattr(head.original_module, "bias", None)
        if base_bias is not None:
            raise NotImplementedError(
                "trainable delimiter rows with a biased LM head are not supported"
            ) from None
        object.__setattr__(head, "bias", None)


def prepare(model, tokenizer, method: ZoomRSFTMethod, peft_config) -> tuple[Any, Any, dict[str, Any]]:
    """The :func:`zoomr.sft.train_sft` hook: delimiter tokens + trainable rows (the PEFT model is built here)."""
    ids = ensure_tokens(model, tokenizer, method.trainable_tokens)
    extra: dict[str, Any] = {"trainable_tokens": dict(zip(method.trainable_tokens, ids))}
    if peft_config is None:  # full fine-tuning: every row trains anyway
        return model, None, extra
    from peft import get_peft_model

    peft_config.trainable_token_indices = trainable_token_indices(model, ids)
    extra["trainable_rows"] = {k: len(v) for k, v in peft_config.trainable_token_indices.items()}
    model = get_peft_model(model, peft_config)
    expose_head_bias(model)
    return model, None, extra


def summary_coverage(dataset) -> dict[str, float]:
    """How many assistant turns carry summaries, and how many per turn."""
    counts = [
        sum(m["content"].count(tokens.BEGIN_SUMMARY) for m in ex["messages"] if m["role"] == "assistant")
        for ex in dataset
    ]
    with_any = sum(c > 0 for c in counts)
    return {"rows_with_summaries": with_any, "summaries_per_row": sum(counts) / max(len(counts), 1)}


def markup_problem(text: str) -> str | None:
    """What is wrong with the summary markup of an assistant turn (None: every ``<|begin_of_summary|>`` is closed by
    an ``<|end_of_summary|>`` before the next opens, and no ``<|end_of_summary|>`` stands alone)."""
    tags = sorted((m.start(), t) for t in tokens.SUMMARY_TAGS for m in re.finditer(re.escape(t), text))
    open_at = None
    for at, tag in tags:
        if tag == tokens.BEGIN_SUMMARY and open_at is not None:
            return f"a {tag} at character {at} inside the summary opened at {open_at}"
        if tag == tokens.END_SUMMARY and open_at is None:
            return f"a {tag} at character {at} closes no summary"
        open_at = at if tag == tokens.BEGIN_SUMMARY else None
    return None if open_at is None else f"the {tokens.BEGIN_SUMMARY} at character {open_at} is never closed"


def check_markup(dataset, name: str) -> None:
    """Refuse rows whose summary markup is malformed (the model was trained to write it so, without a word),
    naming the first rows by id and what is wrong."""
    bad = [(ex.get("id", i), problem) for i, ex in enumerate(dataset)
           for m in ex["messages"] if m["role"] == "assistant" and (problem := markup_problem(m["content"]))]  # fmt: skip
    if bad:
        shown = "; ".join(f"row {i!r}: {p}" for i, p in bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
        raise SystemExit(
            f"data {name!r}: {len(bad)} of {len(dataset)} rows have malformed summary markup: {shown}; fix or remove "
            "them (python -m data_prep +pipeline=summarize writes well-formed rows), or pass method.require_summaries=false"
        )


def run(cfg) -> dict[str, Any]:
    method = to_dataclass(ZoomRSFTMethod, cfg.method)
    if method.require_summaries:
        rows = load_sft_dataset(to_plain(cfg.data), None)
        cover = summary_coverage(rows)
        if cover["rows_with_summaries"] == 0:
            raise SystemExit(
                f"data {cfg.data.name!r} has no {tokens.BEGIN_SUMMARY}: run `python -m data_prep "
                "+pipeline=summarize` and train on its output (data=zoomr_summaries data.path=...), "
                "or pass method.require_summaries=false"
            )
        check_markup(rows, cfg.data.name)
        log.info("summary coverage: %s", cover)
    return train_sft(cfg, schema=ZoomRSFTMethod, prepare=prepare)
