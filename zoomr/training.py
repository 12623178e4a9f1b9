"""What the Hugging Face ``Trainer`` recipes share (``train/sft.py``, ``train/abridge.py``, ZoomR SFT on top of SFT).

- :func:`trainer_arguments`: the ``TrainingArguments`` fields every recipe maps the same way from its method
  config (batching, optimiser scalars, length, checkpoint cadence, logging, DeepSpeed);
- :class:`LogAtSave`: a log line at every checkpoint, so the loss history saved in a checkpoint covers every
  step up to it and :func:`whole_run_loss` is exact after a resume; a logged loss or gradient norm that is NaN or
  infinite stops the run there (:class:`NonFiniteLoss`), before that step's checkpoint or ``final/`` is saved;
- :func:`train_or_restore`: trains from the plan's checkpoint, or restores it when it already holds the last
  step (the HF loop would otherwise run past ``max_steps``);
- :func:`load_sft_dataset`: the data config's loader (``data.loader`` names a module with ``sft_dataset``);
  :func:`check_data_source`, its local file checked before a trainer writes any run state;
- :func:`checked_arguments`: the ``TrainingArguments`` built before any run state, what transformers refuses there
  named as the user's setting.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from transformers import TrainerCallback

from zoomr.paths import MissingInput, resolve_repo_path
from zoomr.rundir import RunPlan
from zoomr.schemas.checks import SettingsError

T = TypeVar("T")


def trainer_arguments(
    method: Any, optim: Any, output_dir: Path, seed: int, report_to: list[str], deepspeed: dict | None
) -> dict[str, Any]:
    """Keyword arguments for ``TrainingArguments`` (or TRL's ``SFTConfig``) shared by the recipes.

    ``method`` supplies ``per_device_batch_size``, ``gradient_accumulation_steps``, ``max_steps``,
    ``logging_steps``, ``save_steps``, ``save_total_limit``, ``bf16``, ``gradient_checkpointing``;
    ``optim`` supplies ``learning_rate``, ``weight_decay``, ``max_grad_norm`` (the method itself for SFT).
    """
    return {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": method.per_device_batch_size,
        "gradient_accumulation_steps": method.gradient_accumulation_steps,
        "learning_rate": optim.learning_rate,
        "weight_decay": optim.weight_decay,
        "max_grad_norm": optim.max_grad_norm,
        "max_steps": method.max_steps,
        "logging_steps": method.logging_steps,
        "logging_first_step": True,  # loss_start of the summary, even for runs shorter than logging_steps
        "save_steps": method.save_steps,
        "save_total_limit": method.save_total_limit,
        "bf16": method.bf16,
        "activation_checkpointing": method.gradient_checkpointing,
        "report_to": report_to,
        "seed": seed,
        "deepspeed": deepspeed,
        "disable_tqdm": False,
        "save_only_model": False,  # a resume needs the optimizer, scheduler and RNG state
        # a NaN / inf step loss is logged as it is (LogAtSave stops the run on it): HF's default filter logged the
        # window's mean of the finite ones instead, 0 when none was, so a diverged run reported loss 0 and saved
        "logging_nan_inf_filter": False,
    }


def checked_arguments(build: Callable[[], T]) -> T:
    """``build()`` (a ``TrainingArguments`` or TRL ``SFTConfig``), called by a trainer before any run state: what
    transformers refuses only there is the user's setting, named without a traceback. ``method.bf16=true`` on a
    machine without bf16 or an unknown ``method.lr_scheduler`` (``ValueError``) is a :class:`SettingsError`,
    ``deepspeed=zero2`` without the package a :class:`MissingInput` (both were tracebacks after ``config.json``
    and ``settings.json``)."""
    try:
        return build()
    except ImportError as e:  # importlib.metadata.PackageNotFoundError: a backend's package is not installed
        hint = " (deepspeed=zero2|zero3: pip install -e '.[deepspeed]')" if "deepspeed" in str(e) else ""
        raise MissingInput(f"the trainer needs a package this environment lacks: {str(e).strip()}{hint}") from None
    except ValueError as e:
        raise SettingsError(f"the trainer refuses these settings: {e}") from None


class NonFiniteLoss(RuntimeError):
    """The training loss (or the gradient norm) became NaN or infinite: the weights are no longer a model."""


class LogAtSave(TrainerCallback):
    """Log the running loss whenever a checkpoint is about to be saved and at the last step, so a run
    shorter than ``logging_steps`` still reports its final loss (with ``logging_first_step``, its first).

    A logged ``loss`` or ``grad_norm`` that is NaN or infinite raises :class:`NonFiniteLoss` (the log comes before
    the save of its step): the run stops instead of saving NaN weights as a checkpoint and as ``final/``."""

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save or (state.max_steps and state.global_step >= state.max_steps):
            control.should_log = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        bad = {k: logs[k] for k in ("loss", "grad_norm") if k in (logs or {}) and not math.isfinite(float(logs[k]))}
        if bad:
            said = ", ".join(f"{k} {v}" for k, v in bad.items())
            raise NonFiniteLoss(
                f"training diverged: {said} at step {state.global_step}; stopped before saving that step (the "
                f"checkpoints before it in {args.output_dir} are kept). Lower method.learning_rate (or "
                "method.max_grad_norm), or check that the start model's weights are finite"
            )
        return control


def whole_run_loss(log_history: list[dict[str, Any]]) -> float:
    """Mean training loss per optimisation step over the whole run, from the ``loss`` lines of the log
    history (each the mean since the previous line), including the lines restored from a checkpoint."""
    lines = sorted((h for h in log_history if "loss" in h and "step" in h), key=lambda h: h["step"])
    total, last = 0.0, 0
    for h in lines:
        total += float(h["loss"]) * (int(h["step"]) - last)
        last = int(h["step"])
    return total / last if last else math.nan


def train_or_restore(trainer, plan: RunPlan, max_steps: int | None) -> float:
    """Train (resuming from ``plan.resume_from``), or load that checkpoint when it already holds the last
    step; return the seconds spent."""
    t0 = time.time()
    if plan.needs_training(max_steps):
        try:
            trainer.train(resume_from_checkpoint=plan.resume_from)
        except NonFiniteLoss as e:  # the message alone, as a refusal: no traceback through the Trainer
            raise SystemExit(str(e)) from None
    else:
        from transformers.trainer_callback import TrainerState

        trainer._load_from_checkpoint(plan.resume_from)
        trainer.state = TrainerState.load_from_json(str(Path(plan.resume_from) / "trainer_state.json"))
    return time.time() - t0


def load_sft_dataset(data: dict[str, Any], tokenizer):
    """The rows of a data config as a ``datasets.Dataset`` of chat messages, from its ``loader`` module."""
    loader = data.get("loader")
    if not loader:
        raise ValueError(f"data config {data.get('name')!r} has no loader module")
    return importlib.import_module(loader).sft_dataset(data, tokenizer)


def check_data_source(data: dict[str, Any]) -> None:
    """Refuse impossible data settings and ``data.source=local`` with a ``data.path`` that does not exist (relative
    to the cwd or the repo), so a trainer fails before :func:`zoomr.rundir.prepare_run` writes anything. The data
    schema's own checks run here (Hydra does not run ``__post_init__``): ``data.format=bogus`` was a traceback from
    the loader after the run's config and settings were written."""
    from zoomr.schemas import to_dataclass
    from zoomr.schemas.sft import TracesData
    from zoomr.schemas.testbed import TestbedData

    schema = {TracesData.loader: TracesData, TestbedData.loader: TestbedData}.get(data.get("loader"))
    if schema is not None:  # a loader of the user's own takes its own settings
        to_dataclass(schema, data)
    if data.get("source") == "local" and data.get("path"):
        path = resolve_repo_path(data["path"])
        if not path.exists():
            raise MissingInput(f"data.path={data['path']}: no such file or directory (looked at {path})")


def loss_curve(log_history: list[dict[str, Any]], key: str = "loss") -> list[tuple[int, float]]:
    """(step, value) of every logged ``key`` in a Trainer's ``log_history``."""
    return [(int(h["step"]), float(h[key])) for h in log_history if key in h and "step" in h]


def training_losses(trainer: Any) -> dict[str, Any]:
    """Steps, first and last logged loss, and the whole-run mean loss (across resumes) of a finished Trainer."""
    history = trainer.state.log_history
    curve = loss_curve(history)
    return {
        "steps": trainer.state.global_step,
        "loss_start": curve[0][1] if curve else float("nan"),
        "loss_end": curve[-1][1] if curve else float("nan"),
        "train_loss": whole_run_loss(history),  # the whole run, across resumes
    }
