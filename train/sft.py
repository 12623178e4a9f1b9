"""Supervised fine-tuning recipe (``+method=sft``): TRL SFTTrainer, full or LoRA, assistant-only loss.

Checkpoints go to ``<run_dir>/checkpoints``; ``resume=auto`` continues from the newest one, so a
requeued SLURM job picks up where it stopped. DeepSpeed ZeRO-2/3 via ``deepspeed=zero2|zero3``.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zoomr.entry import model_spec, start_run, to_plain
from zoomr.models import load_model, load_tokenizer
from zoomr.schemas import to_dataclass
from zoomr.schemas.sft import SFTMethod

log = logging.getLogger(__name__)


def latest_checkpoint(checkpoint_dir: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(checkpoint_dir)) if checkpoint_dir.is_dir() else None


def resolve_resume(resume: str, checkpoint_dir: Path) -> str | None:
    if resume == "never":
        return None
    if resume == "auto":
        return latest_checkpoint(checkpoint_dir)
    if not Path(resume).exists():
        raise FileNotFoundError(f"resume={resume!r}: no such checkpoint")
    return resume


def load_sft_dataset(data: dict[str, Any], tokenizer):
    loader = data.get("loader")
    if not loader:
        raise ValueError(f"data config {data.get('name')!r} has no loader module")
    return importlib.import_module(loader).sft_dataset(data, tokenizer)


def lora_config(method: SFTMethod):
    from peft import LoraConfig

    return LoraConfig(
        r=method.lora.r,
        lora_alpha=method.lora.alpha,
        lora_dropout=method.lora.dropout,
        target_modules=list(method.lora.target_modules),
        task_type="CAUSAL_LM",
    )


def sft_args(method: SFTMethod, output_dir: Path, seed: int, report_to: list[str], deepspeed: dict | None):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        max_length=method.max_length,
        assistant_only_loss=method.assistant_only_loss,
        per_device_train_batch_size=method.per_device_batch_size,
        gradient_accumulation_steps=method.gradient_accumulation_steps,
        learning_rate=method.learning_rate,
        weight_decay=method.weight_decay,
        warmup_steps=method.warmup_ratio,  # a float < 1 is a fraction of the steps (transformers 5)
        lr_scheduler_type=method.lr_scheduler,
        max_grad_norm=method.max_grad_norm,
        max_steps=method.max_steps,
        num_train_epochs=method.epochs,
        logging_steps=method.logging_steps,
        save_steps=method.save_steps,
        save_total_limit=method.save_total_limit,
        bf16=method.bf16,
        activation_checkpointing=method.gradient_checkpointing,
        report_to=report_to,
        seed=seed,
        deepspeed=deepspeed,
        dataset_num_proc=None,
        disable_tqdm=False,
        save_only_model=False,
    )


def run(cfg, schema: type = SFTMethod, prepare: Callable | None = None) -> dict[str, Any]:
    """Train; recipes built on this one pass their method ``schema`` (a subclass of SFTMethod) and
    ``prepare(model, tokenizer, method, peft_config) -> (model, peft_config, extra_summary)``,
    called before the trainer is built (e.g. train/zoomr_sft.py adds tokens and trainable rows)."""
    from trl import SFTTrainer

    method: SFTMethod = to_dataclass(schema, cfg.method)
    spec = model_spec(cfg)
    run_dir, logger = start_run(cfg, job_type="train")
    tokenizer = load_tokenizer(spec, cfg.cache_dir)
    model = load_model(spec, cfg.cache_dir)
    peft_config = lora_config(method) if method.use_lora else None
    extra: dict[str, Any] = {}
    if prepare is not None:
        model, peft_config, extra = prepare(model, tokenizer, method, peft_config)
    dataset = load_sft_dataset(to_plain(cfg.data), tokenizer)
    ckpt_dir = run_dir / "checkpoints"
    resume = resolve_resume(cfg.resume, ckpt_dir)
    trainer = SFTTrainer(
        model=model,
        args=sft_args(
            method,
            ckpt_dir,
            cfg.seed,
            ["wandb"] if logger.enabled else [],
            to_plain(cfg.deepspeed.config) if cfg.deepspeed.config else None,
        ),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    t0 = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    elapsed = time.time() - t0
    final_dir = run_dir / "final"
    trainer.save_model(str(final_dir))
    tokenizer.save_pretrained(str(final_dir))
    from train.report import loss_curve, write_summary

    curve = loss_curve(trainer.state.log_history)
    summary = {
        "method": method.name,
        "model": spec.name,
        "data": f"{cfg.data.name} ({len(dataset)} examples)",
        "mode": f"LoRA r={method.lora.r}" if method.use_lora else "full fine-tuning",
        "trainable_params": f"{trainable:,} / {total:,}",
        "resumed_from": resume or "-",
        "steps": trainer.state.global_step,
        "loss_start": curve[0][1] if curve else float("nan"),
        "loss_end": curve[-1][1] if curve else float("nan"),
        "train_loss": float(result.training_loss),
        "seconds": round(elapsed, 1),
        "checkpoint": str(final_dir),
        "run_dir": str(run_dir),
        **extra,
    }
    write_summary(run_dir, summary, f"SFT finished: {cfg.run_name}")
    logger.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
    logger.finish()
    return summary
