"""``python -m train +method=sft`` end to end on tiny models: trains, summarises, checkpoints, resumes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FAST = ["data.max_samples=4", "method.max_length=256", "method.logging_steps=1"]


def train(run_dir: Path, *overrides: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "train", "+method=sft", *FAST, *overrides, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SFT finished" in proc.stdout
    assert "'pin_memory' argument is set as true" not in proc.stderr  # torch's warning at every epoch on a CPU
    return json.loads((run_dir / "summary.json").read_text())


def test_lora_sft_trains_checkpoints_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    first = train(run_dir, "method.max_steps=2", "method.save_steps=2", "method.learning_rate=1e-3")
    assert first["steps"] == 2 and first["resumed_from"] == "-"
    assert first["mode"].startswith("LoRA")
    assert (run_dir / "checkpoints" / "checkpoint-2").is_dir()
    assert (Path(first["checkpoint"]) / "adapter_config.json").exists()
    assert first["loss_start"] > 0
    second = train(run_dir, "method.max_steps=3", "method.save_steps=2", "method.learning_rate=1e-3")
    assert second["resumed_from"].endswith("checkpoint-2")
    assert second["steps"] == 3


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
def test_full_finetuning_on_other_architectures_lowers_the_loss(tmp_path, model):
    summary = train(
        tmp_path / model, f"model={model}", "method.use_lora=false", "method.max_steps=6",
        "method.learning_rate=3e-3", "method.warmup_ratio=0.0", "method.per_device_batch_size=4",
    )
    assert summary["mode"] == "full fine-tuning"
    assert summary["loss_end"] < summary["loss_start"]
    assert (Path(summary["checkpoint"]) / "model.safetensors").exists()


def test_held_out_split_is_disjoint_seeded_and_never_empty():
    import datasets

    from zoomr.sft import held_out_split

    ds = datasets.Dataset.from_list([{"id": str(i)} for i in range(10)])
    train_rows, held = held_out_split(ds, 0.25, seed=3)
    assert len(held) == 2 and len(train_rows) == 8  # round(2.5) = 2
    assert not set(held["id"]) & set(train_rows["id"]) and set(held["id"]) | set(train_rows["id"]) == set(ds["id"])
    assert held_out_split(ds, 0.25, seed=3)[1]["id"] == held["id"]  # a resume holds out the same rows
    assert len(held_out_split(ds, 0.01, seed=3)[1]) == 1 and held_out_split(ds, 0.0, seed=3) == (ds, None)
    with pytest.raises(ValueError, match="holds out all 1 rows"):
        held_out_split(ds.select([0]), 0.5, seed=3)


def test_eval_fraction_holds_rows_out_and_reports_their_loss(tmp_path):
    run_dir = tmp_path / "run"
    summary = train(run_dir, "data.max_samples=8", "data.eval_fraction=0.25", "method.max_steps=2", "method.save_steps=2")
    assert summary["data"].endswith("(6 examples, 2 held out)")
    state = json.loads((run_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())
    logged = [h["eval_loss"] for h in state["log_history"] if "eval_loss" in h]
    assert len(logged) == 1 and summary["eval_loss"] == pytest.approx(logged[0], rel=1e-5)  # same weights, same rows
