"""The block-masked training loop shared by AbridgeKV and LightThinker (AbridgeKV §3, appendix "training").

An HF ``Trainer`` whose loss is the masked response CE of one forward per batch (each layer under its own
mask: FlexAttention ``BlockMask`` on CUDA, dense + SDPA on CPU) and whose LR schedule is the paper's
(warm-up, flat, linear decay; ``method.optim``); the collator, the ``TrainingArguments`` of a masked
recipe, its data and start model, and the final save. Recipes (``train/abridge.py``,
``train/lightthinker.py``) build on it; subclasses override :meth:`AbridgeTrainer.build_masks`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import Trainer, TrainingArguments

from zoomr.abridge.data import StreamSet, batch_meta, build_streams, collate, lazy_streams
from zoomr.abridge.forward import token_ce
from zoomr.abridge.layout import IGNORE, AbridgeLayout, interleave, pause_token_ids
from zoomr.abridge.mask import layer_masks
from zoomr.abridge.optim import lr_factor
from zoomr.cache.abridge import AbridgeMethod
from zoomr.cache.base import sliding_window_problem
from zoomr.models import ModelSpec, load_model, load_tokenizer
from zoomr.paths import MissingInput, resolve_repo_path
from zoomr.rundir import write_json
from zoomr.schemas.abridge import AbridgeOptim
from zoomr.schemas.checks import SettingsError
from zoomr.testbed.checkpoint import DATA_CONFIG_FILE  # the data config a checkpoint was trained on
from zoomr.training import LogAtSave, checked_arguments, load_sft_dataset, trainer_arguments


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
        labels = inputs["labels"]
        # the output layer runs only where some row has a label (the testbed labels ~5% of positions)
        scored = (labels != IGNORE).any(0).nonzero().squeeze(1)
        logits = model(
            input_ids=inputs["input_ids"],
            position_ids=inputs["position_ids"],
            abridge_masks=masks,
            use_cache=False,
            logits_to_keep=scored,
        ).logits
        labels = labels[:, scored]
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


def check_heldout_setting(data: dict[str, Any]) -> None:
    """Refuse ``data.eval_fraction`` > 0: the masked trainers hold out ``method.heldout_examples`` (the first N
    examples) and never read it, so the rows the user asked to hold out were trained on without a word."""
    if data.get("eval_fraction"):
        raise SettingsError(
            f"data.eval_fraction={data['eval_fraction']}: this trainer holds out the first method.heldout_examples "
            "examples instead and would train on the rows asked for; set data.eval_fraction=0 (and "
            "method.heldout_examples=N)"
        )


def check_loop(m: AbridgeMethod | Any, device: torch.device, output_dir: Path, seed: int, deepspeed: dict | None) -> None:
    """Refuse, before any run state, the loop settings the ``Trainer`` would refuse only once built or training:
    ``method.mask_backend=flex`` off CUDA (FlexAttention has no backward on the CPU: a traceback at the first step,
    after ``checkpoints/``), and whatever ``TrainingArguments`` refuses (:func:`zoomr.training.checked_arguments`)."""
    if m.mask_backend == "flex" and device.type != "cuda":
        raise SettingsError(
            f"method.mask_backend=flex trains on CUDA only (FlexAttention has no backward on {device.type}): "
            "use auto or chunked"
        )
    checked_arguments(lambda: training_args(m, output_dir, seed, [], deepspeed))


def load_streams(
    data: dict[str, Any], tokenizer, layout: AbridgeLayout, max_prompt: int, max_response: int, heldout: int
) -> StreamSet:
    """The data config's examples as streams; the first ``heldout`` are the held-out set.

    A loader module with ``token_examples(data, tokenizer)`` (the recall testbed) supplies token ids with the
    response positions that carry loss, built into streams on access (:class:`LazyStreams`); any other
    loader's ``sft_dataset`` is tokenised here with loss on every response token.
    """
    pauses = pause_token_ids(tokenizer, layout.num_pause)
    lazy = lazy_streams(
        data, tokenizer, lambda p, r, loss: interleave(p, r, layout, pauses, loss), max_prompt, max_response
    )
    if lazy is not None:
        streams = StreamSet(lazy)  # type: ignore[arg-type]
    else:
        streams = build_streams(load_sft_dataset(data, tokenizer), tokenizer, layout, max_prompt, max_response)
    if len(streams.streams) <= heldout:
        raise SettingsError(f"{streams.describe()}: need more than heldout_examples={heldout} to train on")
    return streams


def load_start_model(spec: ModelSpec, m: AbridgeMethod | Any, cache_dir: str, device: torch.device):
    """The model and tokenizer to fine-tune: ``m.init_from`` (a checkpoint directory) or the model config. A model
    with sliding-window attention is refused: the block-mask attention has no window (it would train another model)."""
    if m.init_from:
        path = resolve_repo_path(m.init_from)  # a checkpoint shipped in the repo works from any directory
        if not (path / "config.json").is_file():
            raise MissingInput(f"method.init_from={m.init_from}: not a checkpoint directory (no config.json at {path})")
        spec = ModelSpec(name=spec.name, arch=spec.arch, hf_id=str(path), dtype=spec.dtype)
    model = load_model(spec, cache_dir, device=device)
    if problem := sliding_window_problem(model.config, "the masked trainers' block-mask attention"):
        raise SettingsError(problem)
    return model, load_tokenizer(spec, cache_dir)




def save_final(trainer: Trainer, spec: ModelSpec, tokenizer, run_dir: Path, data: dict[str, Any] | None = None):
    """The trained model in eval mode with its own attention again, saved with its tokenizer (and the data
    config, ``data.json``) in ``<run_dir>/final``; returns (model, final dir)."""
    model = trainer.model.eval()
    model.set_attn_implementation(spec.attn_implementation)
    final_dir = run_dir / "final"
    trainer.save_model(str(final_dir))
    tokenizer.save_pretrained(str(final_dir))
    if data is not None:
        write_json(final_dir / DATA_CONFIG_FILE, data)
    return model, final_dir


def masked_trainer(
    cls: type[AbridgeTrainer], m: Any, model, tokenizer, datasets: tuple[list, list], output_dir: Path,
    seed: int, report_to: list[str], deepspeed: dict | None, **extra: Any,
) -> AbridgeTrainer:
    """``cls`` over ``datasets = (train streams, held-out streams)`` with the method's loop settings, the
    paper's schedule and a log line at every checkpoint; ``extra`` goes to ``cls`` (e.g. ``quotas``)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return cls(
        model=model,
        args=training_args(m, output_dir, seed, report_to, deepspeed),
        train_dataset=datasets[0],
        eval_dataset=datasets[1],
        data_collator=stream_collator(pad_id),
        processing_class=tokenizer,
        mask_backend=m.mask_backend,
        optim=m.optim,
        callbacks=[LogAtSave()],
        **extra,
    )
