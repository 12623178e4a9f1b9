"""Supervised fine-tuning with TRL's SFTTrainer, full or LoRA, assistant-only loss: the body of the
``+method=sft`` recipe and of the recipes built on it (``+method=zoomr_sft``, ZoomR §3.2).

Checkpoints go to ``<run_dir>/checkpoints``; ``resume=auto`` continues from the newest complete one, so a
requeued SLURM job picks up where it stopped; a rerun with other settings is refused and a rerun of a finished
run does nothing (:mod:`zoomr.rundir`). DeepSpeed ZeRO-2/3 via ``deepspeed=zero2|zero3``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zoomr.entry import model_spec, start_run, to_plain
from zoomr.models import load_model, load_tokenizer
from zoomr.rundir import finish_run, prepare_run
from zoomr.schemas import to_dataclass
from zoomr.schemas.checks import SettingsError
from zoomr.schemas.sft import SFTMethod
from zoomr.training import (
    LogAtSave,
    check_data_source,
    checked_arguments,
    load_sft_dataset,
    train_or_restore,
    trainer_arguments,
    training_losses,
)

log = logging.getLogger(__name__)


def lora_config(method: SFTMethod):
    from peft import LoraConfig

    return LoraConfig(
        r=method.lora.r,
        lora_alpha=method.lora.alpha,
        lora_dropout=method.lora.dropout,
        target_modules=list(method.lora.target_modules),
        task_type="CAUSAL_LM",
    )


def sft_args(
    method: SFTMethod, output_dir: Path, seed: int, report_to: list[str], deepspeed: dict | None, evaluate: bool = False
):
    """TRL's SFTConfig; ``evaluate``: the held-out loss at every save (``data.eval_fraction`` > 0)."""
    from trl import SFTConfig

    return SFTConfig(
        **trainer_arguments(method, method, output_dir, seed, report_to, deepspeed),
        max_length=method.max_length,
        assistant_only_loss=method.assistant_only_loss,
        warmup_steps=method.warmup_ratio,  # a float < 1 is a fraction of the steps (transformers 5)
        lr_scheduler_type=method.lr_scheduler,
        num_train_epochs=method.epochs,
        dataset_num_proc=None,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=method.save_steps if evaluate else None,
        per_device_eval_batch_size=method.per_device_batch_size,
        dataloader_pin_memory=torch.cuda.is_available(),  # (AbridgeKV's too) on CPU torch warned at every epoch
    )


def held_out_split(dataset: Any, fraction: float, seed: int) -> tuple[Any, Any | None]:
    """(train, held-out) rows: ``fraction`` of them (at least one) held out by a seeded shuffle; (all, None) at 0."""
    if not fraction:
        return dataset, None
    n_eval = max(1, round(fraction * len(dataset)))
    if n_eval >= len(dataset):
        raise ValueError(f"data.eval_fraction={fraction} holds out all {len(dataset)} rows: nothing left to train on")
    split = dataset.train_test_split(test_size=n_eval, seed=seed, shuffle=True)
    return split["train"], split["test"]


def check_lora_targets(model: Any, targets: list[str]) -> None:
    """Refuse ``method.lora.target_modules`` naming a module the model lacks (PEFT raised a traceback when none
    matched, after the run state, and skipped a misspelt one silently when another matched)."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in targets if t not in names]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"})
        raise SettingsError(
            f"method.lora.target_modules: {missing} name no module of the model; its linear layers: {linear}"
        )


def check_chat_template(tokenizer: Any, model: str, assistant_only_loss: bool) -> None:
    """Refuse a tokenizer the chat rows cannot be trained with: one without a chat template (a ``ValueError``
    traceback from transformers), or, with ``method.assistant_only_loss``, one whose template has no
    ``{% generation %}`` markers that TRL knows how to add (a traceback from TRL's trainer after the run state)."""
    if not getattr(tokenizer, "chat_template", None):
        raise SettingsError(
            f"model {model}: its tokenizer has no chat template, and the SFT rows are chat messages rendered with it; "
            "train a model whose tokenizer has one (an instruct or reasoning checkpoint)"
        )
    if assistant_only_loss:
        from trl.chat_template_utils import get_training_chat_template, has_generation_markers

        if not has_generation_markers(tokenizer.chat_template):
            try:
                get_training_chat_template(tokenizer)
            except ValueError:
                raise SettingsError(
                    f"method.assistant_only_loss=true: the chat template of model {model} marks no assistant turn "
                    "({% generation %} ... {% endgeneration %}) and TRL has no training version of it; add the "
                    "markers to the template or set method.assistant_only_loss=false (loss on the whole conversation)"
                ) from None


def check_max_length(dataset: Any, tokenizer: Any, max_length: int) -> None:
    """Refuse a ``method.max_length`` no row's prompt fits under: TRL truncates every row to it and drops the rows
    left without an assistant token, so the run died in the sampler (``num_samples=0``) after its run state."""
    for row in dataset:
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
        if len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) < max_length:
            return
    raise SettingsError(
        f"method.max_length={max_length}: every one of the {len(dataset)} rows' prompts is at least that long, so "
        "truncation leaves no response token to learn from; raise method.max_length"
    )


def length_report(prepared: Any, rows: int, max_length: int) -> dict[str, str]:
    """What TRL's truncation did to the training rows (it says nothing): how many of the ``prepared`` (tokenised)
    rows reach ``max_length`` and were cut there (their end, the answer and end of turn included, is never
    learned), and how many of the ``rows`` given it dropped (a prompt filling ``max_length`` leaves no response
    token). Each is logged as a warning and returned as a summary field when there are any."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(prepared.with_format("arrow")["input_ids"])
    cut = int(pc.sum(pc.greater_equal(lengths, max_length)).as_py() or 0)
    dropped = rows - len(prepared)
    out = {}
    if cut:
        out["max_length_cut"] = (
            f"{cut} of {len(prepared)} training rows reach method.max_length={max_length} and are cut there "
            "(their end is never learned)"
        )
    if dropped:
        out["max_length_dropped"] = (
            f"{dropped} of {rows} training rows dropped: their prompt fills method.max_length={max_length}"
        )
    for line in out.values():
        log.warning("SFT: %s", line)
    return out


def train_sft(
    cfg: Any, schema: type = SFTMethod, prepare: Callable | None = None, rows: Any = None
) -> dict[str, Any]:
    """Train one SFT run from the entry point's composed config; recipes built on it pass their method ``schema`` (a subclass of SFTMethod) and
    ``prepare(model, tokenizer, method, peft_config) -> (model, peft_config, extra_summary)``,
    called before the trainer is built (e.g. train/zoomr_sft.py adds tokens and trainable rows), and ``rows``, the
    data config's rows when the recipe has already loaded them (:func:`load_sft_dataset`; loaded here otherwise)."""
    from trl import SFTTrainer

    method: SFTMethod = to_dataclass(schema, cfg.method)
    spec = model_spec(cfg)
    check_data_source(to_plain(cfg.data))
    # everything the user's settings can break is built before prepare_run writes settings.json: the model, the
    # LoRA targets, the data and the trainer's arguments (they came as tracebacks after the run state)
    tokenizer = load_tokenizer(spec, cfg.cache_dir)
    check_chat_template(tokenizer, spec.name, method.assistant_only_loss)
    model = load_model(spec, cfg.cache_dir)
    peft_config = lora_config(method) if method.use_lora else None
    if peft_config is not None:
        check_lora_targets(model, method.lora.target_modules)
    extra: dict[str, Any] = {}
    if prepare is not None:  # its random draws (new embedding rows, a PEFT model's init) come from the run's seed:
        from transformers import set_seed  # unseeded, two runs of one zoomr_sft command trained two models

        set_seed(cfg.seed)
        model, peft_config, extra = prepare(model, tokenizer, method, peft_config)
    data = to_plain(cfg.data)
    rows = load_sft_dataset(data, tokenizer) if rows is None else rows
    try:
        dataset, held_out = held_out_split(rows, float(data.get("eval_fraction") or 0), cfg.seed)
    except ValueError as e:  # every row held out
        raise SettingsError(str(e)) from None
    check_max_length(dataset, tokenizer, method.max_length)
    ckpt_dir = Path(cfg.run_dir) / "checkpoints"
    deepspeed = to_plain(cfg.deepspeed.config) if cfg.deepspeed.config else None
    checked_arguments(lambda: sft_args(method, ckpt_dir, cfg.seed, [], deepspeed, evaluate=held_out is not None))
    plan = prepare_run(cfg.run_dir, to_plain(cfg), cfg.resume, title="SFT")
    if plan.finished:
        return plan.finished
    run_dir, logger = start_run(cfg, job_type="train")
    args = sft_args(
        method, ckpt_dir, cfg.seed, ["wandb"] if logger.enabled else [], deepspeed, evaluate=held_out is not None
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=held_out,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[LogAtSave()],
    )
    lengths = length_report(trainer.train_dataset, len(dataset), method.max_length)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    elapsed = train_or_restore(trainer, plan, method.max_steps)
    eval_loss = trainer.evaluate()["eval_loss"] if held_out is not None else None
    final_dir = run_dir / "final"
    trainer.save_model(str(final_dir))
    tokenizer.save_pretrained(str(final_dir))
    summary = {
        "method": method.name,
        "model": spec.name,
        "data": f"{cfg.data.name} ({len(dataset)} examples"
        + (f", {len(held_out)} held out)" if held_out is not None else ")"),
        **lengths,
        **({"eval_loss": eval_loss} if eval_loss is not None else {}),
        "mode": f"LoRA r={method.lora.r}" if method.use_lora else "full fine-tuning",
        "trainable_params": f"{trainable:,} / {total:,}",
        "resumed_from": plan.resume_from or "-",
        **training_losses(trainer),
        "seconds": round(elapsed, 1),
        "checkpoint": str(final_dir),
        "run_dir": str(run_dir),
        **extra,
    }
    return finish_run(plan, logger, summary, f"SFT finished: {cfg.run_name}")
