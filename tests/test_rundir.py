"""zoomr.rundir on hand-made run directories (no training): settings guard, finished runs, checkpoint choice."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from zoomr import rundir
from zoomr.cache.abridge import AbridgeMethod
from zoomr.runlock import LOCK_FILE, release_run_lock
from zoomr.schemas.sft import SFTMethod
from zoomr.training import whole_run_loss


def config(**method) -> dict:
    return {
        "seed": 1, "run_name": "r", "run_dir": "x", "resume": "auto", "logger": {"mode": "disabled"},
        "model": {"name": "tiny"}, "data": {"name": "traces", "max_samples": 4},
        "method": {"name": "sft", "learning_rate": 1e-3, "max_steps": 4, "epochs": 1.0, "save_steps": 2,
                   "lora": {"r": 16}, **method},
    }  # fmt: skip


def checkpoint(ckpt_dir: Path, step: int) -> Path:
    """A checkpoint with the files a HF Trainer writes, in its order."""
    out = ckpt_dir / f"checkpoint-{step}"
    out.mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(out / "model.safetensors"))
    torch.save({"state": {0: torch.ones(8)}}, out / "optimizer.pt")
    torch.save({"last_epoch": step}, out / "scheduler.pt")
    torch.save({"python": 1}, out / "rng_state.pth")
    (out / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 4, "log_history": []}))
    return out


def finished_run(tmp_path: Path, cfg: dict, steps=(2, 4)) -> Path:
    run_dir = tmp_path / "run"
    plan = rundir.prepare_run(run_dir, cfg)
    for s in steps:
        checkpoint(run_dir / "checkpoints", s)
    (run_dir / "final").mkdir()
    plan.finish({"steps": steps[-1], "train_loss": 1.5})
    return run_dir


def snapshot(run_dir: Path) -> dict:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_a_rerun_with_other_settings_is_refused_naming_each_key_and_writes_nothing(tmp_path):
    run_dir = finished_run(tmp_path, config())
    before = snapshot(run_dir)
    with pytest.raises(SystemExit) as err:
        rundir.prepare_run(run_dir, config(learning_rate=5e-4, lora={"r": 8}) | {"seed": 2})
    msg = str(err.value)
    assert "method.learning_rate: was 0.001, now 0.0005" in msg
    assert "method.lora.r: was 16, now 8" in msg and "seed: was 1, now 2" in msg
    assert "max_steps" not in msg and "run_name=" in msg
    assert snapshot(run_dir) == before


def test_where_and_how_often_may_change_and_a_finished_run_is_returned_untouched(tmp_path, capsys):
    run_dir = finished_run(tmp_path, config())
    before = snapshot(run_dir)
    cfg = config(save_steps=1, logging_steps=1) | {"run_name": "other", "logger": {"mode": "offline"}}
    plan = rundir.prepare_run(run_dir, cfg, title="SFT")
    assert plan.finished == {"steps": 4, "train_loss": 1.5}
    assert "SFT already finished" in capsys.readouterr().out
    assert snapshot(run_dir) == before


def test_derived_settings_are_guarded(tmp_path):
    run_dir = tmp_path / "run"
    rundir.prepare_run(run_dir, config(), derived={"quotas": [2, 2]})
    checkpoint(run_dir / "checkpoints", 2)
    with pytest.raises(SystemExit, match=r"derived\.quotas: was \[2, 2\], now \[1, 1\]"):
        rundir.prepare_run(run_dir, config(), derived={"quotas": [1, 1]})


def test_a_longer_run_continues_from_the_newest_checkpoint_and_a_shorter_one_is_refused(tmp_path):
    run_dir = finished_run(tmp_path, config())
    plan = rundir.prepare_run(run_dir, config(max_steps=6))
    assert plan.finished is None and plan.resume_from.endswith("checkpoint-4") and plan.extended
    assert plan.needs_training(6)
    record = json.loads((run_dir / "settings.json").read_text())
    assert record["extent"]["max_steps"] == 6 and record["finished"]["max_steps"] == 4
    # killed before it saved anything: the next rerun still knows the run is not finished at 6
    assert rundir.prepare_run(run_dir, config(max_steps=6)).finished is None
    with pytest.raises(SystemExit, match="finished 4 steps already; method.max_steps=3"):
        rundir.prepare_run(run_dir, config(max_steps=3))


def test_killed_after_the_last_checkpoint_restores_it_instead_of_training(tmp_path):
    run_dir = tmp_path / "run"
    rundir.prepare_run(run_dir, config())
    checkpoint(run_dir / "checkpoints", 4)  # no summary: killed during the final save
    plan = rundir.prepare_run(run_dir, config())
    assert plan.resume_from.endswith("checkpoint-4") and not plan.needs_training(4)
    epochs = rundir.prepare_run(run_dir, config(max_steps=-1))  # epochs mode: the checkpoint's own max_steps
    assert epochs.extended and epochs.needs_training(-1)


def test_a_torn_summary_is_not_a_finished_run(tmp_path):
    run_dir = finished_run(tmp_path, config())
    (run_dir / "summary.json").write_text('{"steps": 4, "train_')
    plan = rundir.prepare_run(run_dir, config())
    assert plan.finished is None and plan.resume_from.endswith("checkpoint-4")


def test_incomplete_newest_checkpoint_is_skipped_with_the_reason_and_moved_aside(tmp_path, caplog):
    ckpts = tmp_path / "checkpoints"
    checkpoint(ckpts, 2)
    cut = checkpoint(ckpts, 4)
    (cut / "trainer_state.json").unlink()
    with caplog.at_level("INFO"):
        found = rundir.newest_complete_checkpoint(ckpts)
    assert found == ckpts / "checkpoint-2"
    assert "skipping incomplete checkpoint" in caplog.text and "trainer_state.json" in caplog.text
    assert "checkpoint-2, the newest complete" in caplog.text
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-2", "incomplete-checkpoint-4-1"]


HF_ORDER = ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"]


@pytest.mark.parametrize("cut", HF_ORDER)
def test_a_kill_while_writing_any_file_leaves_an_incomplete_checkpoint(tmp_path, cut):
    ckpt = checkpoint(tmp_path, 4)
    assert rundir.hf_checkpoint_problems(ckpt) == []
    for later in HF_ORDER[HF_ORDER.index(cut) + 1 :]:
        (ckpt / later).unlink()
    data = (ckpt / cut).read_bytes()
    (ckpt / cut).write_bytes(data[: len(data) // 2])
    assert rundir.hf_checkpoint_problems(ckpt)


def test_sharded_weights_need_every_shard(tmp_path):
    ckpt = checkpoint(tmp_path, 2)
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    assert any("model-00002-of-00002" in p for p in rundir.hf_checkpoint_problems(ckpt))
    save_file({"v": torch.zeros(3)}, str(ckpt / "model-00002-of-00002.safetensors"))
    assert rundir.hf_checkpoint_problems(ckpt) == []


def test_a_deepspeed_checkpoint_needs_its_engine_states_not_optimizer_pt(tmp_path):
    ckpt = checkpoint(tmp_path, 4)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt"):
        (ckpt / name).unlink()
    ds = ckpt / "global_step4"
    ds.mkdir()
    torch.save({"module": {"w": torch.ones(4)}}, ds / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {}}, ds / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert rundir.hf_checkpoint_problems(ckpt) == []
    optim = ds / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    optim.write_bytes(optim.read_bytes()[:40])
    assert "optim_states.pt" in " ".join(rundir.hf_checkpoint_problems(ckpt))


def test_pick_resume_skips_incomplete_checkpoints_with_any_prefix(tmp_path):
    checkpoint(tmp_path, 2)
    (checkpoint(tmp_path, 4) / "trainer_state.json").write_text("{")
    assert rundir.pick_resume(tmp_path, "auto", rundir.hf_checkpoint_problems).endswith("checkpoint-2")
    assert rundir.pick_resume(tmp_path, "never", rundir.hf_checkpoint_problems) is None
    (tmp_path / "checkpoint-2").rename(tmp_path / "step-2")  # the testbed trainer's names
    assert rundir.pick_resume(tmp_path, "auto", rundir.hf_checkpoint_problems) is None
    assert rundir.pick_resume(tmp_path, "auto", rundir.hf_checkpoint_problems, "step-").endswith("step-2")


def test_an_explicit_incomplete_checkpoint_is_refused_naming_what_is_missing(tmp_path):
    ckpt = checkpoint(tmp_path / "checkpoints", 2)
    (ckpt / "optimizer.pt").unlink()
    with pytest.raises(SystemExit, match="incomplete checkpoint: optimizer.pt is missing"):
        rundir.prepare_run(tmp_path / "new", config(), resume=str(ckpt))
    assert not (tmp_path / "new").exists()


def test_resume_never_moves_the_old_run_aside(tmp_path):
    run_dir = finished_run(tmp_path, config())
    plan = rundir.prepare_run(run_dir, config(learning_rate=1.0), resume="never")
    assert plan.resume_from is None and plan.finished is None
    old = run_dir / "replaced-1"
    assert sorted(p.name for p in old.iterdir()) == ["checkpoints", "final", "settings.json", "summary.json"]
    assert not (run_dir / "checkpoints").exists()
    assert json.loads((run_dir / "settings.json").read_text())["settings"]["method.learning_rate"] == 1.0


def test_a_run_directory_from_before_settings_json_is_guarded_by_its_config(tmp_path):
    run_dir = tmp_path / "run"
    checkpoint(run_dir / "checkpoints", 2)
    (run_dir / "config.json").write_text(json.dumps(config()))
    with pytest.raises(SystemExit, match="method.learning_rate"):
        rundir.prepare_run(run_dir, config(learning_rate=1.0))
    assert rundir.prepare_run(run_dir, config()).resume_from.endswith("checkpoint-2")


def test_a_finished_run_from_before_settings_json_is_recognised(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(config()))
    (run_dir / "summary.json").write_text(json.dumps({"steps": 4}))  # e.g. a KVzap fit: no checkpoints
    assert rundir.prepare_run(run_dir, config()).finished == {"steps": 4}


def test_a_checkpoint_put_there_by_hand_is_never_trained_over(tmp_path):
    """A run directory holding only ``final/`` (e.g. a shipped model copied there) has no record of its settings:
    the trainer refuses it, writing nothing, and ``resume=never`` moves it aside."""
    run_dir = tmp_path / "run"
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "final" / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(SystemExit, match=r"holds a trained model \(final\) but no record of the settings"):
        rundir.prepare_run(run_dir, config())
    assert sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE) == ["final"]  # the lock is no state
    rundir.prepare_run(run_dir, config(), resume="never")
    assert (run_dir / "replaced-1" / "final" / "model.safetensors").read_bytes() == b"weights"


def test_a_second_training_of_a_directory_being_trained_is_refused_until_the_first_exits(tmp_path):
    """Two trainings of one directory ran side by side: the second resumed from the first one's checkpoint-20 while
    the first went on, both wrote checkpoints 40 and 60 and ``final/`` in turn."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import json, sys, time; from zoomr import rundir\n"
         f"rundir.prepare_run({str(run_dir)!r}, json.loads(sys.argv[1]))\nprint('held', flush=True); time.sleep(60)",
         json.dumps(config())],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit, match=rf"being written by another training \(pid {holder.pid}\)"):
            rundir.prepare_run(run_dir, config())
    finally:
        holder.kill()
        holder.wait()
    assert rundir.prepare_run(run_dir, config()).resume_from is None  # the kernel freed the killed one's lock
    assert rundir.prepare_run(run_dir, config()).resume_from is None  # this process holds it: taken again freely
    release_run_lock(run_dir)


def test_a_file_system_without_flock_runs_unguarded_with_a_warning(tmp_path, monkeypatch, caplog):
    import errno
    import fcntl

    from zoomr.runlock import RunLock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with RunLock(tmp_path, "training"):
        pass
    assert "cannot lock" in caplog.text and "would not be refused" in caplog.text


def test_a_failed_start_that_trained_nothing_does_not_bind_the_directory(tmp_path):
    run_dir = tmp_path / "run"
    rundir.prepare_run(run_dir, config())  # e.g. the data then failed to load
    assert rundir.prepare_run(run_dir, config(learning_rate=1.0)).resume_from is None


def test_whole_run_loss_weights_each_log_line_by_the_steps_it_covers():
    history = [{"loss": 2.0, "step": 2}, {"eval_loss": 9.0, "step": 2}, {"loss": 1.0, "step": 3}]
    assert whole_run_loss(history) == pytest.approx((2.0 * 2 + 1.0) / 3)
    assert math.isnan(whole_run_loss([]))  # nothing logged


@pytest.mark.parametrize(
    "schema,kwargs,match",
    [
        (SFTMethod, {"max_steps": 0}, "max_steps=0 trains nothing"),
        (SFTMethod, {"max_steps": -2}, "max_steps=-2 trains nothing"),
        (SFTMethod, {"max_steps": -1, "epochs": 0.0}, "epochs=0.0"),
        (AbridgeMethod, {"max_steps": 0}, "AbridgeMethod: max_steps=0"),
    ],
)
def test_a_length_that_trains_nothing_is_refused(schema, kwargs, match):
    with pytest.raises(ValueError, match=match):
        schema(**kwargs)
    assert schema(max_steps=1).max_steps == 1


def test_a_full_disk_keeps_the_old_file_and_names_the_one_it_could_not_write(tmp_path, monkeypatch, capsys):
    """ENOSPC while a summary was written: ``OSError: [Errno 28] No space left on device`` without a path, a
    traceback, and write_json's torn temporary file left beside the kept summary. Now the message names the file."""
    import errno
    import os

    from zoomr.paths import OutputUnwritable
    from zoomr.rundir import write_json
    from zoomr.script import run_script

    summary = tmp_path / "summary.json"
    write_json(summary, {"loss": 1.0})
    real = Path.write_text

    def disk_full(self, data, *args, **kwargs):
        real(self, data[: len(data) // 2], *args, **kwargs)  # what fitted before the disk filled up
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OutputUnwritable, match=f"{summary} cannot be written \\(No space left on device\\)"):
        write_json(summary, {"loss": 0.5})
    monkeypatch.setattr("sys.argv", ["/repo/analysis/slim_runs.py"])
    with pytest.raises(SystemExit) as stop:
        run_script(lambda: write_json(summary, {"loss": 0.5}))
    assert stop.value.code == f"slim_runs: {summary} cannot be written (No space left on device); the file there before is kept"
    monkeypatch.setattr(Path, "write_text", real)
    assert json.loads(summary.read_text()) == {"loss": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no torn temporary file
