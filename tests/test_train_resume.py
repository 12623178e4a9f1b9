"""Training reruns on the real SFT recipe (TRL SFTTrainer, LoRA, tiny qwen2, CPU): a run killed while saving a
checkpoint resumes from the previous complete one and ends with the loss of an uninterrupted run; a finished run
is not trained again; changed settings are refused before anything is written; bad settings write nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra

# 4 samples, batch 2: two steps per epoch; a checkpoint every 2 steps, a log line every 3 (the summary's
# whole-run loss must not depend on the two lining up)
TINY = [
    "data.max_samples=4", "method.max_length=256", "method.max_steps=4", "method.save_steps=2",
    "method.logging_steps=3", "method.learning_rate=1e-3", "method.warmup_ratio=0.0", "logger=none",
]  # fmt: skip


def compose_sft(run_dir: Path, cache_dir: str, *overrides: str):
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        extra = [f"run_dir={run_dir}", "hydra.runtime.output_dir=.", f"cache_dir={cache_dir}"]
        return compose("train", overrides=["+method=sft", *TINY, *overrides, *extra])


def train(run_dir: Path, cache_dir: str, *overrides: str) -> dict:
    import train.sft as recipe

    return recipe.run(compose_sft(run_dir, cache_dir, *overrides))


def kill_during_save(checkpoint: Path) -> None:
    """What a kill inside ``Trainer._save_checkpoint`` leaves: the model is written first (here cut half-way
    through the adapter weights), then optimizer, scheduler, RNG state and trainer_state.json last."""
    weights = checkpoint / "adapter_model.safetensors"
    data = weights.read_bytes()
    for f in checkpoint.iterdir():
        if f.name not in ("adapter_config.json", weights.name):
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    weights.write_bytes(data[: len(data) // 2])


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache_dir) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("sft") / "run"
    summary = train(run_dir, cache_dir)
    assert summary["steps"] == 4 and summary["resumed_from"] == "-"
    assert checkpoints(run_dir) == ["checkpoint-2", "checkpoint-4"]
    return run_dir, summary


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*"))


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    shutil.rmtree(dst / "final")
    (dst / "summary.json").unlink()
    return dst


def test_kill_during_save_resumes_from_the_previous_complete_checkpoint(finished, tmp_path, cache_dir, caplog):
    src, reference = finished
    run_dir = copy_run(src, tmp_path / "killed")
    kill_during_save(run_dir / "checkpoints" / "checkpoint-4")
    with caplog.at_level("INFO"):
        summary = train(run_dir, cache_dir)
    assert summary["resumed_from"].endswith("checkpoint-2")
    assert "checkpoint-4" in caplog.text and "trainer_state.json" in caplog.text  # says what it skipped and why
    assert summary["steps"] == 4
    assert summary["loss_end"] == pytest.approx(reference["loss_end"], rel=1e-5)
    # the summary's train_loss covers the whole run, not only the steps after the resume
    assert summary["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-5)


HF_SAVE_ORDER = ["adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"]


def test_a_real_checkpoint_is_complete_and_cut_anywhere_in_the_save_order_is_not(finished, tmp_path):
    from zoomr.rundir import hf_checkpoint_problems

    src = finished[0] / "checkpoints" / "checkpoint-4"
    written = [(src / name).stat().st_mtime_ns for name in HF_SAVE_ORDER]
    assert written == sorted(written)  # the order Trainer._save_checkpoint writes them in
    assert hf_checkpoint_problems(src) == []
    for i, cut in enumerate(HF_SAVE_ORDER):
        ckpt = Path(shutil.copytree(src, tmp_path / cut))
        for later in HF_SAVE_ORDER[i + 1 :]:
            (ckpt / later).unlink()
        data = (ckpt / cut).read_bytes()
        (ckpt / cut).write_bytes(data[: len(data) // 2])
        assert hf_checkpoint_problems(ckpt), f"a kill while writing {cut} went unnoticed"


def test_whole_run_train_loss_matches_the_trainers_own_on_an_uninterrupted_run(finished):
    run_dir, summary = finished
    state = json.loads((run_dir / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    losses = [h for h in state["log_history"] if "loss" in h]
    # the first step (logging_first_step), every checkpoint (so a resume misses none) and the last step
    assert [h["step"] for h in losses] == [1, 2, 3, 4]
    weighted = sum(h["loss"] for h in losses) / 4  # each line is the mean since the previous one: one step each
    assert summary["train_loss"] == pytest.approx(weighted, rel=1e-6)


def test_killed_after_the_last_checkpoint_finishes_without_training_past_max_steps(finished, tmp_path, cache_dir):
    src, reference = finished
    run_dir = copy_run(src, tmp_path / "late")
    summary = train(run_dir, cache_dir)
    assert summary["steps"] == 4 and summary["resumed_from"].endswith("checkpoint-4")
    assert checkpoints(run_dir) == ["checkpoint-2", "checkpoint-4"]
    assert summary["loss_end"] == pytest.approx(reference["loss_end"], rel=1e-6)
    assert summary["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-6)
    assert (run_dir / "final" / "adapter_model.safetensors").exists()


def test_rerun_of_a_finished_run_does_not_train_again(finished, cache_dir, capsys):
    run_dir, reference = finished
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    summary_bytes = (run_dir / "summary.json").read_bytes()
    again = train(run_dir, cache_dir, "method.logging_steps=1")  # cadence settings may change
    assert again == json.loads(summary_bytes)
    assert "already finished" in capsys.readouterr().out
    assert (run_dir / "summary.json").read_bytes() == summary_bytes
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before


def test_rerun_with_other_settings_is_refused_naming_them_and_writes_nothing(finished, cache_dir):
    run_dir, _ = finished
    before = {p: p.read_bytes() for p in run_dir.glob("*.json")}
    with pytest.raises(SystemExit, match=r"method\.learning_rate: was 0\.001, now 0\.0005") as err:
        train(run_dir, cache_dir, "method.learning_rate=5e-4", "method.lora.r=8")
    assert "method.lora.r: was 16, now 8" in str(err.value) and "run_name=" in str(err.value)
    assert {p: p.read_bytes() for p in run_dir.glob("*.json")} == before


@pytest.mark.parametrize("bad", ["method.max_steps=0", "method.max_steps=-1 method.epochs=0"])
def test_a_run_that_would_train_nothing_is_refused_before_any_state(tmp_path, cache_dir, bad):
    run_dir = tmp_path / "bad"
    with pytest.raises((SystemExit, ValueError), match="max_steps"):
        train(run_dir, cache_dir, *bad.split())
    assert not run_dir.exists()


class _Payload:
    """Unpickling this runs ``Path.touch`` on ``marker``: what a crafted checkpoint can do to a full unpickler."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def compose_testbed(tmp_path: Path, cache_dir: str, resume: Path):
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=[
            "+method=sft_testbed", "data=testbed", "model=tiny-testbed", "logger=none", "method.max_steps=3",
            "method.eval_examples=1", f"cache_dir={cache_dir}", f"run_dir={tmp_path / 'run'}",
            "hydra.runtime.output_dir=.", f"resume={resume}",
        ])  # fmt: skip


def test_testbed_resume_never_unpickles_code_from_a_checkpoint(tmp_path, cache_dir):
    import pickle

    import torch

    import train.testbed_pretrain as recipe
    from zoomr.entry import model_spec
    from zoomr.models import load_model, load_tokenizer

    ckpt, marker = tmp_path / "step-2", tmp_path / "code-ran"
    cfg = compose_testbed(tmp_path, cache_dir, ckpt)
    load_model(model_spec(cfg), cache_dir).save_pretrained(ckpt)
    load_tokenizer(model_spec(cfg), cache_dir).save_pretrained(ckpt)
    torch.save({"optimizer": _Payload(marker), "step": 2, "elapsed": 0.0}, ckpt / "trainer_state.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        recipe.run(cfg)
    assert not marker.exists()


def test_testbed_resumes_from_its_own_checkpoint_with_the_safe_loader(tmp_path, cache_dir):
    import torch

    import train.testbed_pretrain as recipe
    from zoomr.entry import model_spec
    from zoomr.models import load_model, load_tokenizer

    cfg = compose_testbed(tmp_path, cache_dir, tmp_path / "ckpts" / "step-2")
    model, tokenizer = load_model(model_spec(cfg), cache_dir), load_tokenizer(model_spec(cfg), cache_dir)
    opt = torch.optim.AdamW(recipe.param_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.98))
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()  # the optimizer state holds tensors, ints, floats, tuples and None
    recipe.save_checkpoint(model, tokenizer, opt, 2, 1.5, tmp_path / "ckpts")
    summary = recipe.run(cfg)
    assert summary["resumed_from"].endswith("step-2") and summary["steps"] == 3


def test_a_run_shorter_than_logging_steps_reports_its_first_and_last_loss(tmp_path, cache_dir):
    """2 steps at logging_steps=10 (the ``zoomr_sft`` 2-step case): loss_start / loss_end are real numbers,
    and the whole-run loss lies between them or near them (not NaN)."""
    import math

    summary = train(tmp_path / "short", cache_dir, "method.max_steps=2", "method.logging_steps=10")
    assert summary["steps"] == 2
    for key in ("loss_start", "loss_end", "train_loss"):
        assert math.isfinite(summary[key]) and summary[key] > 0, (key, summary[key])


# the testbed trainer (its own loop, ``step-N`` checkpoints) goes through the same run-directory guard
TB_TINY = [
    "+method=sft_testbed", "data=testbed", "model=tiny-testbed", "logger=none", "data.trace_tokens=160",
    "method.max_steps=4", "method.curriculum.copy_steps=0", "method.curriculum.recall_steps=1",
    "method.tokens_per_step=512", "method.curriculum.copy_tokens_per_step=256", "method.eval_every=2",
    "method.eval_examples=2", "method.save_every=3",
]  # fmt: skip


def train_testbed(run_dir: Path, cache_dir: str, *overrides: str) -> dict:
    import train.testbed_pretrain as recipe

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*TB_TINY, *overrides, f"cache_dir={cache_dir}", f"run_dir={run_dir}",
                                          "hydra.runtime.output_dir=."])  # fmt: skip
    return recipe.run(cfg)


def test_testbed_rerun_refuses_other_settings_finishes_at_once_and_continues_when_longer(tmp_path, cache_dir,
                                                                                         monkeypatch):
    import train.testbed_pretrain as recipe

    run = tmp_path / "tb"
    history, summary = {}, {}  # W&B's history and summary keys (history was logged unprefixed: loss, tf_answer_all)
    start = recipe.start_run

    def start_run(*args, **kwargs):
        run_dir, logger = start(*args, **kwargs)
        logger.log, logger.summary = (lambda metrics, step=None: history.update(metrics)), summary.update
        return run_dir, logger

    monkeypatch.setattr(recipe, "start_run", start_run)
    first = train_testbed(run, cache_dir)
    monkeypatch.undo()
    assert first["steps"] == 4 and sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-3", "step-4"]
    assert {"train/loss", "train/lr", "train/tf_answer_all"} <= set(history) and all(k.startswith("train/") for k in history)
    assert summary["tf_answer_all"] == first["tf_answer_all"]  # RunLogger prefixes it: train/tf_answer_all, one key
    written = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit, match=r"method.learning_rate: was 0.002, now 0.5"):
        train_testbed(run, cache_dir, "method.learning_rate=0.5")
    # how often it logs, evaluates or saves, and its threads, are not what it trains: the rerun returns the summary
    assert train_testbed(run, cache_dir, "method.eval_every=1", "method.threads=1") == first
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == written  # nothing rewritten by either
    longer = train_testbed(run, cache_dir, "method.max_steps=6")
    assert longer["steps"] == 6 and longer["resumed_from"].endswith("step-4")
    # the tokens and held-out evaluations of the steps before the resume are kept (the checkpoint carries them): they
    # were dropped, so a resumed run reported only its last steps' tokens and eval_history.json only their evaluations
    assert longer["tokens_seen"] > first["tokens_seen"]
    assert [e["step"] for e in json.loads((run / "eval_history.json").read_text())] == [2, 4, 6]


def test_testbed_run_stopped_by_max_seconds_is_continued_not_reported_finished(tmp_path, cache_dir):
    run = tmp_path / "tb"
    stopped = train_testbed(run, cache_dir, "method.max_seconds=1e-9")
    assert stopped["steps"] == 1 and (run / "checkpoints" / "step-1").is_dir()  # saved where it stopped
    assert "finished" not in json.loads((run / "settings.json").read_text())
    rest = train_testbed(run, cache_dir)
    assert rest["steps"] == 4 and rest["resumed_from"].endswith("step-1")


def test_testbed_summary_gives_the_training_loss_of_the_whole_run_across_a_resume(tmp_path, cache_dir, monkeypatch):
    """The testbed trainer's summary (and W&B summary) had no training loss, which every other trainer's gives:
    ``loss_start``, ``loss_end`` and ``train_loss`` (the mean per step) are those of the whole run, the steps
    before a resume included (kept in the checkpoint). A run stopped by ``method.max_seconds`` gives W&B its
    summary too."""
    import train.testbed_pretrain as recipe

    logged, held = {}, {}  # step -> W&B train/loss; W&B summary
    start = recipe.start_run

    def start_run(*args, **kwargs):
        run_dir, logger = start(*args, **kwargs)
        logger.log = lambda metrics, step=None: logged.update({step: metrics["train/loss"]} if "train/loss" in metrics else {})
        logger.summary = held.update
        return run_dir, logger

    monkeypatch.setattr(recipe, "start_run", start_run)
    run = tmp_path / "tb"
    stopped = train_testbed(run, cache_dir, "method.max_seconds=1e-9", "method.log_every=1")  # after step 1
    # a run stopped by method.max_seconds wrote its summary.json but gave its W&B run no summary
    assert held["steps"] == stopped["steps"] == 1 and held["train_loss"] == stopped["train_loss"] == round(logged[0], 4)
    summary = train_testbed(run, cache_dir, "method.log_every=1")
    assert summary["resumed_from"].endswith("step-1") and sorted(logged) == [0, 1, 2, 3]
    losses = [logged[s] for s in sorted(logged)]
    expected = {"loss_start": losses[0], "loss_end": losses[-1], "train_loss": sum(losses) / 4}
    assert {k: summary[k] for k in expected} == {k: round(v, 4) for k, v in expected.items()}
    assert {k: held[k] for k in expected} == {k: summary[k] for k in expected}
