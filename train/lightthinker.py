"""LightThinker training (``python -m train +method=lightthinker``; zjunlp/LightThinker, METHODS.md "Baselines").

Each response is cut into thoughts (paragraphs inside the thought tags; plain paragraphs for the testbed),
a ``<|splitter|>`` after each, then the n cache tokens and ``<|continue|>`` (:mod:`zoomr.lightthinker.layout`).
One forward per batch under the thought mask (:mod:`zoomr.lightthinker.mask`: FlexAttention ``BlockMask``
on CUDA, dense mask + SDPA on CPU); next-token CE on thought tokens, splitters and the tail, none on cache
or continue tokens. The loop, optimiser, schedule, DeepSpeed, checkpoints and ``resume=auto`` are the
AbridgeKV trainer's (:mod:`train.abridge`), so the two arms train alike. ``method.init_from`` starts from a
checkpoint (e.g. the testbed model with its word-level tokenizer). The run ends with held-out CE under
the mask and with the full history, a served sample (splitters written, rows held vs full KV) and a
summary table.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from zoomr import tokens
from zoomr.abridge.attention import use_abridge_attention
from zoomr.abridge.data import LazyStreams, StreamSet, lazy_streams
from zoomr.abridge.forward import heldout_full_kv_ce, heldout_masked_ce
from zoomr.abridge.trainer import (
    AbridgeTrainer,
    check_heldout_setting,
    check_loop,
    load_start_model,
    masked_trainer,
    save_final,
)
from zoomr.cache.lightthinker import LightThinkerMethod
from zoomr.entry import model_spec, pick_device, start_run, to_plain
from zoomr.lightthinker.data import ThoughtStats, build_streams
from zoomr.lightthinker.layout import (
    ThoughtTokens,
    add_lightthinker_tokens,
    interleave,
    paper_cache_tokens,
    save_config,
)
from zoomr.lightthinker.mask import splitter_accuracy, thought_masks
from zoomr.models import DTYPES
from zoomr.rundir import finish_run, prepare_run
from zoomr.schemas import to_dataclass
from zoomr.schemas.checks import SettingsError
from zoomr.training import check_data_source, load_sft_dataset, train_or_restore

log = logging.getLogger(__name__)


class LightThinkerTrainer(AbridgeTrainer):
    """The AbridgeKV trainer with LightThinker's thought mask at every layer."""

    def __init__(self, *args, num_layers: int, **kwargs):
        super().__init__(*args, quotas=None, **kwargs)
        self.num_layers = num_layers

    def build_masks(self, inputs) -> list:
        return thought_masks(inputs, self.num_layers, self.mask_backend)


def cache_token_count(m: LightThinkerMethod, model_config) -> int:
    """``method.num_cache_tokens``, or the paper's value for the architecture (9 Qwen, 7 Llama)."""
    return (
        m.num_cache_tokens if m.num_cache_tokens is not None else paper_cache_tokens(model_config.model_type)
    )


def load_streams(data: dict[str, Any], tokenizer, tt: ThoughtTokens, m: LightThinkerMethod) -> StreamSet:
    """The data config's examples as streams; the first ``heldout_examples`` are the held-out set.

    A loader with ``token_examples`` (the recall testbed, ``data.thought_splitter=true``) gives token ids whose
    responses already hold the model-written splitters, with loss on the model-written positions only,
    built into streams on access; any other loader's text is segmented here (paragraphs as thoughts).
    """
    lazy = lazy_streams(
        data, tokenizer, lambda p, r, loss: interleave(p, r, tt, loss), m.max_prompt_tokens, m.max_response_tokens
    )
    if lazy is not None:
        if not any(tt.splitter in lazy.example(i)[1] for i in range(min(len(lazy), 4))):
            raise SettingsError(
                f"data {data.get('name')!r}: its responses hold no {tokens.SPLITTER}, so no thought would ever "
                "end; on the testbed set data.thought_splitter=true (the model writes a splitter after each "
                "paragraph break)"
            )
        streams = StreamSet(lazy)  # type: ignore[arg-type]
    else:
        dataset = load_sft_dataset(data, tokenizer)
        streams = build_streams(
            dataset, tokenizer, tt, m.max_prompt_tokens, m.max_response_tokens, m.min_thought_chars
        )
    if len(streams.streams) <= m.heldout_examples:
        raise SettingsError(
            f"{streams.describe()}: need more than heldout_examples={m.heldout_examples} to train on"
        )
    return streams


def scripts_of(streams) -> list[list[int | None]] | None:
    """The environment's script of each lazily built stream (its response, ``None`` where the model writes,
    then the end of the turn is the model's), or None for text data (the model writes everything)."""
    if not isinstance(streams, LazyStreams):
        return None
    out = []
    for i in range(len(streams)):
        _, response, loss = streams.example(i)
        writes = set(loss)
        out.append([None if j in writes else t for j, t in enumerate(response)])
    return out


@torch.no_grad()
def served_sample(model, tokenizer, streams, tt: ThoughtTokens, max_new_tokens: int) -> dict[str, Any]:
    """Decode the held-out prompts as one batch with the ``lightthinker`` policy and with full KV at the
    evaluation settings (T=0.6, top-p 0.95, top-k 20, seed 1234): splitters the model wrote, thoughts
    freed, and mean rows held per (layer, KV head, sequence, step). Testbed streams decode with their
    environment's script (:func:`scripts_of`), as in the evaluator."""
    from zoomr.cache.lightthinker import LightThinkerCache
    from zoomr.engine import DecodeSettings, generate, mean_rows
    from zoomr.lightthinker.layout import PROMPT

    prompts = [[t for t, k in zip(s.input_ids, s.kind) if k == PROMPT] for s in streams]
    script = scripts_of(streams)
    # a scripted trace ends with the environment's end of turn
    stop = [tokenizer.convert_tokens_to_ids(tokens.IM_END)] if script else None
    settings = DecodeSettings(
        max_new_tokens=max_new_tokens, temperature=0.6, top_p=0.95, top_k=20, seed=1234, progress=False,
        stop_token_ids=stop,
    )
    cache = LightThinkerCache(LightThinkerMethod(), model.config, tokenizer, num_cache_tokens=tt.n)
    outs = generate(model, tokenizer, prompts, cache, settings, script)
    full = generate(model, tokenizer, prompts, {"policy": "full"}, settings, script)
    return {
        "served": f"{len(outs)} held-out prompts x {max_new_tokens} tokens max, T=0.6",
        "served_tokens": sum(o.n_tokens for o in outs),
        "served_splitters": sum(o.token_ids.count(tt.splitter) for o in outs),
        "served_mean_rows": round(mean_rows(outs), 1),
        "full_kv_mean_rows": round(mean_rows(full), 1),
    }


def run(cfg) -> dict[str, Any]:
    m: LightThinkerMethod = to_dataclass(LightThinkerMethod, cfg.method)
    spec = model_spec(cfg)
    check_data_source(to_plain(cfg.data))
    check_heldout_setting(to_plain(cfg.data))
    device = pick_device(cfg.device)  # checked at the entry: auto, cpu, cuda or cuda:N this machine has
    model, tokenizer = load_start_model(spec, m, cfg.cache_dir, device)
    n = cache_token_count(m, model.config)
    added = add_lightthinker_tokens(model, tokenizer, n)
    tt = ThoughtTokens.from_tokenizer(tokenizer, n)
    streams = load_streams(to_plain(cfg.data), tokenizer, tt, m)  # data that cannot train is refused before any state
    stats = ThoughtStats.of(streams.streams)
    if stats.thoughts == 0:  # no thought ends inside a response: the run would train plain full-KV attention
        raise SettingsError(
            f"{streams.describe()}: no thought ends within method.max_response_tokens={m.max_response_tokens} "
            f"(method.min_thought_chars={m.min_thought_chars}), so no cache token would ever be trained and the "
            "model would learn full KV; raise method.max_response_tokens or lower method.min_thought_chars"
        )
    if n >= (per_thought := stats.raw_tokens / (stats.thoughts + stats.streams)):  # LightThinker §3: n << a thought
        raise SettingsError(
            f"method.num_cache_tokens={n} is not below the mean thought of {streams.describe()} (~{per_thought:.0f} "
            "tokens): each compressed thought would keep at least as many rows as it had, so nothing would be saved; "
            "give fewer cache tokens (null: the paper's value for the architecture)"
        )
    deepspeed = to_plain(cfg.deepspeed.config) if cfg.deepspeed.config else None
    check_loop(m, device, Path(cfg.run_dir) / "checkpoints", cfg.seed, deepspeed)
    # the guard compares the resolved n too (null resolves by architecture)
    plan = prepare_run(
        cfg.run_dir, to_plain(cfg), cfg.resume, derived={"num_cache_tokens": n}, title="LightThinker training"
    )
    if plan.finished:
        return plan.finished
    run_dir, logger = start_run(cfg, job_type="train")
    save_config(run_dir, n, min_thought_chars=m.min_thought_chars)
    heldout, train_set = streams.streams[: m.heldout_examples], streams.streams[m.heldout_examples :]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    log.info("LightThinker n=%d; %s; %s", n, streams.describe(), stats.describe())

    model.train()
    use_abridge_attention(model)
    trainer = masked_trainer(
        LightThinkerTrainer, m, model, tokenizer, (train_set, heldout), run_dir / "checkpoints", cfg.seed,
        ["wandb"] if logger.enabled else [], deepspeed,
        num_layers=model.config.num_hidden_layers,
    )
    elapsed = train_or_restore(trainer, plan, m.max_steps)

    model, final_dir = save_final(trainer, spec, tokenizer, run_dir, to_plain(cfg.data))
    save_config(
        final_dir,
        n,
        min_thought_chars=m.min_thought_chars,
        heldout_examples=m.heldout_examples,
        max_prompt_tokens=m.max_prompt_tokens,
        max_response_tokens=m.max_response_tokens,
        data=cfg.data.name,
    )
    layers = model.config.num_hidden_layers
    ce_masked = heldout_masked_ce(
        model, heldout, pad_id, lambda b: thought_masks(b, layers, m.mask_backend), m.per_device_batch_size
    )
    ce_full = heldout_full_kv_ce(model, heldout, pad_id)
    split = splitter_accuracy(model, heldout, pad_id, tt.splitter, m.mask_backend, m.per_device_batch_size)
    served = served_sample(model, tokenizer, heldout, tt, min(256, m.max_response_tokens))
    summary = summarize(cfg, m, n, streams, stats, trainer, elapsed, plan.resume_from, added)
    summary |= {
        "heldout_ce_lightthinker": round(ce_masked, 4),
        "heldout_ce_full_kv": round(ce_full, 4),
        "heldout_splitter": f"recall {split['recall']:.2f}, precision {split['precision']:.2f} "
        f"(teacher-forced argmax at {split['splitters']} splitters)",
        **served,
        "checkpoint": str(final_dir),
        "run_dir": str(run_dir),
    }
    # the splitter figures are text in the block above: W&B gets them as numbers (train/heldout_splitter_recall, ...)
    logger.summary({f"heldout_splitter_{k}": split[k] for k in ("recall", "precision", "splitters")})
    return finish_run(plan, logger, summary, f"LightThinker training finished: {cfg.run_name}")


def summarize(cfg, m, n, streams, stats, trainer, elapsed, resume, added) -> dict[str, Any]:
    from zoomr.training import training_losses

    return {
        "method": m.name,
        "model": f"{cfg.model.name} ({DTYPES[cfg.model.dtype]})",
        "data": f"{cfg.data.name}: {streams.describe()}; {m.heldout_examples} held out",
        "thoughts": stats.describe(),
        "cache_tokens": f"n={n} <|o_i|> + <|continue|> per thought ({stats.forced_tokens} forced tokens)",
        "tokens_added": added,
        "mask_backend": m.mask_backend,
        "resumed_from": resume or "-",
        **training_losses(trainer),
        "seconds": round(elapsed, 1),
    }
