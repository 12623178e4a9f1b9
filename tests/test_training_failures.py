"""Trainers on data and models that would give a wrong model without a word (fast: toy models, in-process)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


class Toy(torch.nn.Module):
    """A one-weight "model" whose loss is its weight squared (the HF ``Trainer`` contract: ``.loss``)."""

    def __init__(self, weight: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([weight]))

    def forward(self, x=None, **_):
        return {"loss": (self.w * x).pow(2).sum()}


def toy_trainer(tmp_path: Path, weight: float, steps: int = 3):
    from transformers import Trainer, TrainingArguments

    from zoomr.training import LogAtSave, trainer_arguments

    method = SimpleNamespace(
        per_device_batch_size=1, gradient_accumulation_steps=1, learning_rate=1e-2, weight_decay=0.0,
        max_grad_norm=1.0, max_steps=steps, logging_steps=10, save_steps=1, save_total_limit=5, bf16=False,
        gradient_checkpointing=False,
    )  # fmt: skip
    args = TrainingArguments(**trainer_arguments(method, method, tmp_path / "checkpoints", 0, [], None), use_cpu=True)
    rows = [{"x": torch.ones(1)} for _ in range(steps)]
    return Trainer(model=Toy(weight), args=args, train_dataset=rows, callbacks=[LogAtSave()])


def test_a_run_whose_loss_is_nan_stops_naming_it_and_saves_no_nan_checkpoint(tmp_path):
    """A start model with a NaN weight: HF's NaN filter logged loss 0 at every step and the run saved its NaN
    weights as checkpoints (the SFT summary read loss_start = loss_end = 0.0)."""
    from zoomr.rundir import RunPlan
    from zoomr.training import train_or_restore

    trainer = toy_trainer(tmp_path, float("nan"))
    with pytest.raises(SystemExit, match=r"training diverged: loss nan, grad_norm nan at step 1"):
        train_or_restore(trainer, RunPlan(run_dir=tmp_path, extent={}), 3)
    assert not list((tmp_path / "checkpoints").glob("checkpoint-*"))


def test_a_finite_run_logs_and_saves_as_before(tmp_path):
    from zoomr.rundir import RunPlan
    from zoomr.training import train_or_restore, training_losses

    trainer = toy_trainer(tmp_path, 1.0)
    train_or_restore(trainer, RunPlan(run_dir=tmp_path, extent={}), 3)
    losses = training_losses(trainer)
    assert losses["steps"] == 3 and 0 < losses["loss_end"] < losses["loss_start"] == pytest.approx(1.0)
    assert len(list((tmp_path / "checkpoints").glob("checkpoint-*"))) == 3
