"""AbridgeKV block-masked full fine-tuning (``python -m train +method=abridge``; AbridgeKV §3, appendix "training").

One forward pass per batch over prompt + interleaved response/pause tokens, each layer under its own
quota's block mask; next-token CE on every response token, none on pause tokens, no auxiliary terms.
The HF ``Trainer`` supplies the loop, AdamW (β, weight decay, clipping from ``method.optim``),
DeepSpeed (``deepspeed=zero2|zero3``), checkpoints (``<run_dir>/checkpoints``, ``resume=auto``) and
the progress bar; this module supplies the loss, the collator and the paper's LR schedule.
The run ends with held-out CE under compression and with the full history, and a summary table.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import Trainer, TrainingArguments

from zoomr.abridge.artifacts import save_abridge_config
from zoomr.abridge.attention import use_abridge_attention
from zoomr.abridge.data import StreamSet, batch_meta, build_streams, collate
from zoomr.abridge.forward import heldout_ce, heldout_full_kv_ce, token_ce
from zoomr.abridge.layout import IGNORE, AbridgeLayout, add_pause_tokens
from zoomr.abridge.mask import layer_masks
from zoomr.abridge.optim import lr_factor
from zoomr.abridge.quotas import resolve_quotas
from zoomr.entry import model_spec, start_run, to_plain
from zoomr.models import DTYPES, ModelSpec, load_model, load_tokenizer
from zoomr.rundir import prepare_run
from zoomr.schemas import to_dataclass
from zoomr.schemas.abridge import AbridgeMethod, AbridgeOptim
from zoomr.training import LogAtSave, load_sft_dataset, train_or_restore, trainer_arguments, whole_run_loss

log = logging.getLogger(__name__)


class AbridgeTrainer(Trainer):
    """``Trainer`` whose loss is the block-masked response CE and whose schedule is the paper's."""

    def __init__(self, *args, quotas: list[int] | None, mask_backend: str, optim: AbridgeOptim, **kwargs):
        super().__init__(*args, **kwargs)
        self.quotas = quotas
        self.mask_backend = mask_backend
        self.optim_cfg = optim
        # the loss below is a sum over response tokens divided by the count over the whole
        # accumulated batch (``num_items_in_batch``), so it is already scaled for accumulation
        self.model_accepts_loss_kwargs = True
        self.loss_is_scaled_for_ga = True

    def build_masks(self, inputs) -> list:
        """One mask per layer for this batch (LightThinker's trainer overrides it with its thought mask)."""
        return layer_masks(batch_meta(inputs), self.quotas, self.mask_backend)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        masks = self.build_masks(inputs)
        logits = model(
            input_ids=inputs["input_ids"],
            position_ids=inputs["position_ids"],
            abridge_masks=masks,
            use_cache=False,
        ).logits
        labels = inputs["labels"]
        count = num_items_in_batch if num_items_in_batch is not None else (labels != IGNORE).sum()
        loss = token_ce(logits, labels).sum() / count
        return (loss, {"logits": logits}) if return_outputs else loss

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:
            o = self.optim_cfg
            factor = functools.partial(
                lr_factor,
                total_steps=num_training_steps,
                warmup_fraction=o.warmup_fraction,
                decay_start_fraction=o.decay_start_fraction,
                final_fraction=o.final_lr_fraction,
            )
            self.lr_scheduler = LambdaLR(optimizer or self.optimizer, factor)
            self._created_lr_scheduler = True
        return self.lr_scheduler


def stream_collator(pad_id: int):
    """Batches of streams; ``shift_labels`` tells the Trainer the labels are already next-token aligned."""

    def collate_fn(streams):
        batch = collate(streams, pad_id)
        batch["shift_labels"] = batch["labels"]
        return batch

    return collate_fn


def training_args(
    m: AbridgeMethod | Any, output_dir: Path, seed: int, report_to: list[str], deepspeed: dict | None
) -> TrainingArguments:
    return TrainingArguments(
        **trainer_arguments(m, m.optim, output_dir, seed, report_to, deepspeed),
        per_device_eval_batch_size=m.per_device_batch_size,
        adam_beta1=m.optim.adam_beta1,
        adam_beta2=m.optim.adam_beta2,
        eval_strategy="steps" if m.eval_steps else "no",
        eval_steps=m.eval_steps or None,
        remove_unused_columns=False,
        prediction_loss_only=True,
        dataloader_pin_memory=torch.cuda.is_available(),
    )


def load_streams(
    data: dict[str, Any], tokenizer, layout: AbridgeLayout, max_prompt: int, max_response: int, heldout: int
) -> StreamSet:
    """The data config's examples as streams; the first ``heldout`` are the held-out set."""
    dataset = load_sft_dataset(data, tokenizer)
    streams = build_streams(dataset, tokenizer, layout, max_prompt, max_response)
    if len(streams.streams) <= heldout:
        raise ValueError(f"{streams.describe()}: need more than heldout_examples={heldout} to train on")
    return streams


def load_start_model(spec: ModelSpec, m: AbridgeMethod | Any, cache_dir: str, device: torch.device):
    """The model and tokenizer to fine-tune: ``m.init_from`` (a checkpoint directory) or the model config."""
    if m.init_from:
        start = ModelSpec(name=spec.name, arch=spec.arch, hf_id=m.init_from, dtype=spec.dtype)
        return load_model(start, cache_dir, device=device), load_tokenizer(start, cache_dir)
    return load_model(spec, cache_dir, device=device), load_tokenizer(spec, cache_dir)


def run(cfg) -> dict[str, Any]:
    m: AbridgeMethod = to_dataclass(AbridgeMethod, cfg.method)
    spec = model_spec(cfg)
    layout = AbridgeLayout(m.block_size, m.num_pause, m.code_positions)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu")
    model, tokenizer = load_start_model(spec, m, cfg.cache_dir, device)
    quotas = resolve_quotas(model.config.num_hidden_layers, layout.num_pause, m.quota, m.schedule)
    # the guard compares the resolved quotas too (a schedule file may change under the same name)
    plan = prepare_run(cfg.run_dir, to_plain(cfg), cfg.resume, derived={"quotas": quotas}, title="AbridgeKV training")
    if plan.finished:
        return plan.finished
    run_dir, logger = start_run(cfg, job_type="train")
    save_abridge_config(run_dir, layout, quotas)
    added = add_pause_tokens(model, tokenizer, layout.num_pause)
    streams = load_streams(
        to_plain(cfg.data), tokenizer, layout, m.max_prompt_tokens, m.max_response_tokens, m.heldout_examples
    )
    heldout, train_set = streams.streams[: m.heldout_examples], streams.streams[m.heldout_examples :]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    log.info("AbridgeKV %s, quotas %s; %s", layout, quotas, streams.describe())

    model.train()
    use_abridge_attention(model)
    ckpt_dir = run_dir / "checkpoints"
    trainer = AbridgeTrainer(
        model=model,
        args=training_args(
            m,
            ckpt_dir,
            cfg.seed,
            ["wandb"] if logger.enabled else [],
            to_plain(cfg.deepspeed.config) if cfg.deepspeed.config else None,
        ),
        train_dataset=train_set,
        eval_dataset=heldout,
        data_collator=stream_collator(pad_id),
        processing_class=tokenizer,
        quotas=quotas,
        mask_backend=m.mask_backend,
        optim=m.optim,
        callbacks=[LogAtSave()],
    )
    elapsed = train_or_restore(trainer, plan, m.max_steps)

    model, final_dir = save_final(trainer, spec, tokenizer, run_dir)
    save_abridge_config(
        final_dir,
        layout,
        quotas,
        heldout_examples=m.heldout_examples,
        max_prompt_tokens=m.max_prompt_tokens,
        max_response_tokens=m.max_response_tokens,
        data=cfg.data.name,
    )
    ce_abridge = heldout_ce(model, heldout, quotas, pad_id, m.per_device_batch_size, m.mask_backend)
    ce_full = heldout_full_kv_ce(model, heldout, pad_id)
    summary = summarize(cfg, m, layout, quotas, streams, trainer, elapsed, plan.resume_from, added)
    summary |= {
        "heldout_ce_abridge": round(ce_abridge, 4),
        "heldout_ce_full_kv": round(ce_full, 4),
        "checkpoint": str(final_dir),
        "run_dir": str(run_dir),
    }
    return finish_run(plan, logger, summary, f"AbridgeKV training finished: {cfg.run_name}")


def save_final(trainer: Trainer, spec: ModelSpec, tokenizer, run_dir: Path):
    """The trained model in eval mode with its own attention again, saved with its tokenizer in
    ``<run_dir>/final``; returns (model, final dir)."""
    model = trainer.model.eval()
    model.set_attn_implementation(spec.attn_implementation)
    final_dir = run_dir / "final"
    trainer.save_model(str(final_dir))
    tokenizer.save_pretrained(str(final_dir))
    return model, final_dir


def finish_run(plan, logger, summary: dict[str, Any], title: str) -> dict[str, Any]:
    """Write and print the summary (recording through the run plan that the run finished), log its numbers."""
    from train.report import write_summary

    write_summary(plan, summary, title)
    logger.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
    logger.finish()
    return summary


def summarize(cfg, m, layout, quotas, streams, trainer, elapsed, resume, added) -> dict[str, Any]:
    from train.report import loss_curve

    curve = loss_curve(trainer.state.log_history)
    mean_q = sum(quotas) / len(quotas)
    return {
        "method": m.name,
        "model": f"{cfg.model.name} ({DTYPES[cfg.model.dtype]})",
        "data": f"{cfg.data.name}: {streams.describe()}; {m.heldout_examples} held out",
        "layout": f"C={layout.block_size} K={layout.num_pause} positions={layout.code_positions}",
        "quotas": f"{quotas} (mean {mean_q:g}; block ratio C/q = {layout.block_size / mean_q:.2f}:1)"
        if mean_q
        else str(quotas),
        "pause_tokens_added": added,
        "mask_backend": m.mask_backend,
        "resumed_from": resume or "-",
        "steps": trainer.state.global_step,
        "loss_start": curve[0][1] if curve else float("nan"),
        "loss_end": curve[-1][1] if curve else float("nan"),
        "train_loss": whole_run_loss(trainer.state.log_history),  # the whole run, across resumes
        "seconds": round(elapsed, 1),
    }
