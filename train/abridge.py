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
import time
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import Trainer, TrainingArguments

from train.sft import load_sft_dataset, resolve_resume
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
from zoomr.schemas import to_dataclass
from zoomr.schemas.abridge import AbridgeMethod, AbridgeOptim

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
    o = m.optim
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=m.per_device_batch_size,
        per_device_eval_batch_size=m.per_device_batch_size,
        gradient_accumulation_steps=m.gradient_accumulation_steps,
        learning_rate=o.learning_rate,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        weight_decay=o.weight_decay,
        max_grad_norm=o.max_grad_norm,
        max_steps=m.max_steps,
        logging_steps=m.logging_steps,
        eval_strategy="steps" if m.eval_steps else "no",
        eval_steps=m.eval_steps or None,
        save_steps=m.save_steps,
        save_total_limit=m.save_total_limit,
        bf16=m.bf16,
        activation_checkpointing=m.gradient_checkpointing,
        report_to=report_to,
        seed=seed,
        deepspeed=deepspeed,
        remove_unused_columns=False,
        prediction_loss_only=True,
        disable_tqdm=False,
        save_only_model=False,
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


def guard_resume(run_dir: Path, layout: AbridgeLayout, quotas: list[int], resume: str | None) -> None:
    """Record the run's layout and quotas; refuse to resume a run that was trained with others."""
    from zoomr.abridge.artifacts import load_abridge_config

    if resume and (run_dir / "abridge.json").exists():
        old_layout, old_quotas, _ = load_abridge_config(run_dir)
        if (old_layout, old_quotas) != (layout, quotas):
            raise SystemExit(
                f"{run_dir} was trained with {old_layout}, quotas {old_quotas}; this run asks for {layout}, "
                f"quotas {quotas}. Pick another run_name=… (or resume=never to start over there)."
            )
    save_abridge_config(run_dir, layout, quotas)


def load_start_model(spec: ModelSpec, m: AbridgeMethod | Any, cache_dir: str, device: torch.device):
    """The model and tokenizer to fine-tune: ``m.init_from`` (a checkpoint directory) or the model config."""
    if m.init_from:
        start = ModelSpec(name=spec.name, arch=spec.arch, hf_id=m.init_from, dtype=spec.dtype)
        return load_model(start, cache_dir, device=device), load_tokenizer(start, cache_dir)
    return load_model(spec, cache_dir, device=device), load_tokenizer(spec, cache_dir)


def run(cfg) -> dict[str, Any]:
    m: AbridgeMethod = to_dataclass(AbridgeMethod, cfg.method)
    spec = model_spec(cfg)
    run_dir, logger = start_run(cfg, job_type="train")
    layout = AbridgeLayout(m.block_size, m.num_pause, m.code_positions)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu")
    model, tokenizer = load_start_model(spec, m, cfg.cache_dir, device)
    added = add_pause_tokens(model, tokenizer, layout.num_pause)
    quotas = resolve_quotas(model.config.num_hidden_layers, layout.num_pause, m.quota, m.schedule)
    streams = load_streams(
        to_plain(cfg.data), tokenizer, layout, m.max_prompt_tokens, m.max_response_tokens, m.heldout_examples
    )
    heldout, train_set = streams.streams[: m.heldout_examples], streams.streams[m.heldout_examples :]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    log.info("AbridgeKV %s, quotas %s; %s", layout, quotas, streams.describe())

    model.train()
    use_abridge_attention(model)
    ckpt_dir = run_dir / "checkpoints"
    resume = resolve_resume(cfg.resume, ckpt_dir)
    guard_resume(run_dir, layout, quotas, resume)
    trainer = build_trainer(
        AbridgeTrainer, cfg, m, model, tokenizer, (train_set, heldout), ckpt_dir, logger, quotas=quotas
    )
    model, result, elapsed, final_dir = train_and_save(trainer, resume, spec, tokenizer, run_dir)
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
    summary = summarize(cfg, m, layout, quotas, streams, trainer, result, elapsed, resume, added)
    summary |= {"heldout_ce_abridge": round(ce_abridge, 4), "heldout_ce_full_kv": round(ce_full, 4)}
    return finish_run(summary, final_dir, run_dir, logger, f"AbridgeKV training finished: {cfg.run_name}")


def build_trainer(cls, cfg, m, model, tokenizer, datasets, ckpt_dir: Path, logger, **extra) -> Trainer:
    """A masked-forward ``Trainer`` (``cls``) over ``datasets = (train streams, held-out streams)`` with the
    method's loop settings, the run's seed, logger and DeepSpeed config; ``extra`` goes to ``cls``."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return cls(
        model=model,
        args=training_args(
            m,
            ckpt_dir,
            cfg.seed,
            ["wandb"] if logger.enabled else [],
            to_plain(cfg.deepspeed.config) if cfg.deepspeed.config else None,
        ),
        train_dataset=datasets[0],
        eval_dataset=datasets[1],
        data_collator=stream_collator(pad_id),
        processing_class=tokenizer,
        mask_backend=m.mask_backend,
        optim=m.optim,
        **extra,
    )


def train_and_save(trainer: Trainer, resume: str | None, spec: ModelSpec, tokenizer, run_dir: Path):
    """Train (resuming from ``resume``), switch the model back to eval mode and its own attention, and save
    it with its tokenizer in ``<run_dir>/final``. Returns (model, train result, seconds, final dir)."""
    t0 = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    elapsed = time.time() - t0
    model = trainer.model.eval()
    model.set_attn_implementation(spec.attn_implementation)
    final_dir = run_dir / "final"
    trainer.save_model(str(final_dir))
    tokenizer.save_pretrained(str(final_dir))
    return model, result, elapsed, final_dir


def finish_run(summary: dict[str, Any], final_dir: Path, run_dir: Path, logger, title: str) -> dict[str, Any]:
    """Print and write the summary (``summary.json``), log its numbers, close the logger."""
    from train.report import write_summary

    summary |= {"checkpoint": str(final_dir), "run_dir": str(run_dir)}
    write_summary(run_dir, summary, title)
    logger.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
    logger.finish()
    return summary


def loop_summary(trainer: Trainer, result, elapsed: float, resume: str | None) -> dict[str, Any]:
    """The training loop's part of a summary: resume point, steps, loss curve ends, time."""
    from train.report import loss_curve

    curve = loss_curve(trainer.state.log_history)
    return {
        "resumed_from": resume or "-",
        "steps": trainer.state.global_step,
        "loss_start": curve[0][1] if curve else float("nan"),
        "loss_end": curve[-1][1] if curve else float("nan"),
        "train_loss": float(result.training_loss),
        "seconds": round(elapsed, 1),
    }


def summarize(cfg, m, layout, quotas, streams, trainer, result, elapsed, resume, added) -> dict[str, Any]:
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
        **loop_summary(trainer, result, elapsed, resume),
    }
