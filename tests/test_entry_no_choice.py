"""``python -m train`` / ``python -m analysis`` with no choice: a clear list (train: only methods that train) and
no empty run directory left behind (issue 19.10)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys

import pytest

from zoomr.configs import trainable_methods
from zoomr.paths import REPO_ROOT


def test_trainable_methods_leave_out_decoding_policies():
    names = trainable_methods()
    assert {"abridge", "abridge_allocate", "sft", "zoomr_sft", "kvzap"} <= set(names)
    assert not {"h2o", "streaming", "snapkv", "full", "zoomr"} & set(names)


@pytest.mark.parametrize(("entry", "group"), [("train", "method"), ("analysis", "task")])
def test_no_choice_lists_options_and_leaves_no_run_dir(tmp_path, entry, group):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", entry, f"hydra.run.dir={run_dir}"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and f"no {group} chosen" in proc.stderr
    assert not run_dir.exists()
    if entry == "train":
        listed = proc.stderr.split("available methods: ")[1].split(";")[0].split(", ")
        assert listed == trainable_methods() and "python -m eval +method=" in proc.stderr


@pytest.mark.parametrize("seed", [-5, 2**32])
def test_a_seed_numpy_cannot_take_is_refused_before_the_trainer_writes_anything(tmp_path, seed):
    """``seed=-5`` reached ``transformers.set_seed`` after the AbridgeKV trainer had written its settings,
    config and layout: numpy's "Seed must be between 0 and 2**32 - 1" under a traceback."""
    from zoomr.entry import check_seed

    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "train", "+method=abridge", f"seed={seed}", "logger=none",
                           f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and f"seed={seed}: must be in [0, 2**32 - 1]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()  # no run state: the directory Hydra made (its log alone) is removed again
    check_seed(0), check_seed(2**32 - 1), check_seed(None)  # the ends of the range, and no seed at all, pass


@pytest.mark.slow  # model-loading subprocesses: CI stays under 15 min on a slow day
def test_a_refused_eval_leaves_no_directory_and_keeps_a_users_files(tmp_path):
    """A refused ``python -m eval`` said "nothing was written" but left the run directory Hydra had made, holding
    its ``.hydra/`` and an empty ``__main__.log``; a directory with anything else in it is left as it was."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}

    def refused(run_dir):
        proc = subprocess.run([sys.executable, "-m", "eval", "+method=h2o", "method.budget_rows=-5", "logger=none",
                               f"run_dir={run_dir}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert proc.returncode == 1 and "budget_rows must be > 0, got -5" in proc.stderr, proc.stderr[-1500:]
        assert "nothing was written" in proc.stderr and "Traceback" not in proc.stderr

    refused(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    refused(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_testbed_table_help_is_not_cut_mid_sentence():
    from analysis import testbed_table

    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
        testbed_table.main(["--help"])
    text = " ".join(out.getvalue().split())
    assert "at fractions of the full rows, with recall by reference distance" in text


def test_a_run_dir_that_is_a_file_is_refused_before_the_model_loads(tmp_path):
    """``run_dir=<a file>`` failed at the first write with a ``FileExistsError`` traceback, after the model and the
    data had loaded (train, eval)."""
    from zoomr.entry import check_run_dir

    target = tmp_path / "results"
    target.write_text("a file the user had")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "eval", "benchmark=testbed", "model=tiny-testbed", "logger=none",
                           f"run_dir={target}", f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and f"run_dir={target} is a file" in proc.stderr
    assert "Traceback" not in proc.stderr and target.read_text() == "a file the user had"
    check_run_dir(str(tmp_path)), check_run_dir(str(tmp_path / "new")), check_run_dir(None)  # a directory, new, unset


@pytest.mark.parametrize("entry, overrides, key", [
    ("analysis", ["+task=paper_tables", "task.runs=[analysis/results/miniature/runs/arms/full]"], "task.out"),
    ("data_prep", ["+pipeline=summarize", "logger=none"], "pipeline.out_dir"),
])  # fmt: skip
def test_an_output_directory_that_is_a_file_is_refused_by_its_key(entry, overrides, key, tmp_path):
    """``task.out=<a file>`` (paper_tables) failed with a ``FileExistsError`` traceback after every run was read."""
    target = tmp_path / "results"
    target.write_text("a file the user had")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", entry, *overrides, f"{key}={target}",
                           f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and f"{key}={target} is a file" in proc.stderr
    assert "Traceback" not in proc.stderr and target.read_text() == "a file the user had"


def test_an_unusable_cache_dir_is_refused_before_the_model_loads(tmp_path):
    """``cache_dir=`` under a file (or on a path that cannot exist, e.g. under /proc) failed inside the tokenizer's
    ``save_pretrained`` with a ``FileNotFoundError`` traceback."""
    from zoomr.entry import check_cache_dir

    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "eval", "benchmark=testbed", "model=tiny-testbed", "logger=none",
                           f"cache_dir={blocker / 'cache'}", f"run_dir={tmp_path / 'run'}",
                           f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and f"cache_dir={blocker / 'cache'} cannot be created" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
    with pytest.raises(SystemExit, match="is a file"):
        check_cache_dir(str(blocker))
    check_cache_dir(str(tmp_path / "new" / "cache")), check_cache_dir(None)  # created when missing; unset passes
    assert (tmp_path / "new" / "cache").is_dir()


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "gpu", "cuda:99"])
def test_a_device_this_machine_cannot_use_is_refused_by_name(name):
    """``device=cuda`` on a CPU-only machine ended in torch's "Torch not compiled with CUDA enabled" after the model
    spec and the problems had loaded; ``device=tpu`` in torch's list of 20 device types."""
    from zoomr.entry import check_device

    with pytest.raises(SystemExit, match=rf"device={name}: "):
        check_device(name)
    check_device("auto"), check_device("cpu"), check_device(None)  # always usable


def test_cuda_is_refused_exactly_when_the_machine_has_none(monkeypatch):
    import torch

    from zoomr.entry import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="device=cuda: this machine has 0 CUDA device"):
        check_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda"), check_device("cuda:1")
    with pytest.raises(SystemExit, match="device=cuda:2: this machine has 2 CUDA device"):
        check_device("cuda:2")


def test_an_out_option_that_cannot_be_written_is_refused_when_the_command_line_is_read(tmp_path, capsys):
    """``--out`` naming a file (a directory tool) or a directory (a JSON report), or lying under a file, failed at
    the first write, after the tool's work (``python -m analysis.slim_runs … --out <file>``: NotADirectoryError)."""
    from analysis import slim_runs
    from eval import bench_bootstrap
    from zoomr.paths import output_problem

    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    assert output_problem(a_file, directory=True) == f"{a_file} is a file; give a directory"
    assert output_problem(tmp_path, directory=False) == f"{tmp_path} is a directory; give a file path"
    assert "is a file, so nothing can be written under it" in output_problem(a_file / "x" / "y.json", directory=False)
    assert output_problem(tmp_path / "new" / "dir", directory=True) is None  # created when written
    assert output_problem(tmp_path / "new.json", directory=False) is None
    for main, argv in ((slim_runs.main, [str(REPO_ROOT / "analysis/results/miniature/runs/arms/full")]),
                       (bench_bootstrap.main, [])):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main([*argv, "--out", str(a_file / "out")])
        assert e.value.code == 2 and "is a file, so nothing can be written under it" in capsys.readouterr().err
    assert a_file.read_text() == "kept"


def test_a_directory_out_given_a_file_name_is_refused(tmp_path):
    """``bench_throughput --out x.json`` made a directory named x.json; a directory that exists keeps its name."""
    import argparse

    from zoomr.paths import output_dir

    with pytest.raises(argparse.ArgumentTypeError, match=r"x.json names a .json file, but this --out is the directory"):
        output_dir(str(tmp_path / "x.json"))
    assert not (tmp_path / "x.json").exists()
    (tmp_path / "runs.v2.md").mkdir()
    assert output_dir(str(tmp_path / "runs.v2.md")) == str(tmp_path / "runs.v2.md")
    assert output_dir(str(tmp_path / "sweep.1e-3")) == str(tmp_path / "sweep.1e-3")


def test_select_reads_a_dotted_key_from_a_config_or_plain_dicts():
    from omegaconf import OmegaConf

    from zoomr.entry import select

    plain = {"task": {"out": "runs/x"}, "run_dir": "r", "pipeline": None}
    for cfg in (plain, OmegaConf.create(plain)):
        assert select(cfg, "task.out") == "runs/x" and select(cfg, "run_dir") == "r"
        assert select(cfg, "pipeline.out_dir") is None and select(cfg, "task.missing") is None


def test_a_refused_rerun_leaves_the_finished_runs_hydra_record(tmp_path, monkeypatch):
    """Hydra writes ``.hydra/`` before any check: a refused rerun into a finished run's directory replaced its
    config.yaml / overrides.yaml with the refused command's (config.json stayed right). Run in this process through
    hydra.main (the callbacks run), with Hydra's logging off."""
    from data_prep.__main__ import main

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (run / ".hydra" / "overrides.yaml").write_text("- +pipeline=summarize\n")
    (run / "config.json").write_text("{}")
    fresh = tmp_path / "fresh"
    loggers = [lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    disabled, level = [lg.disabled for lg in loggers], logging.root.level
    try:
        for run_dir in (run, fresh):  # Hydra's logging config "none" leaves logging alone ("disabled" turns every
            monkeypatch.setattr(sys, "argv", [  # existing logger off, for the tests after this one too)
                "data_prep", "+pipeline=summarize", "seed=-1", f"hydra.run.dir={run_dir}",
                "hydra/job_logging=none", "hydra/hydra_logging=none"])  # fmt: skip
            with pytest.raises(SystemExit, match=r"seed=-1: must be in"):
                main()
    finally:
        for lg, was in zip(loggers, disabled):
            lg.disabled = was
        logging.root.setLevel(level)
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["config.yaml", "overrides.yaml"]
    assert (run / ".hydra" / "config.yaml").read_text() == "seed: 1\n"
    assert (run / ".hydra" / "overrides.yaml").read_text() == "- +pipeline=summarize\n"
    assert (run / "config.json").read_text() == "{}" and not fresh.exists()  # a new directory is still removed


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_run_dir_that_cannot_be_created_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """``run_dir=`` on a path that takes no directory (a read-only mount, no permission, under /proc) passed the
    check and failed in the run lock's ``mkdir`` with a ``FileNotFoundError`` / ``PermissionError`` traceback after
    the model had loaded (eval); the directory Hydra had made was left behind. Run in this process through
    hydra.main, with Hydra's logging configs "none"."""
    from eval.__main__ import main
    from zoomr.entry import check_run_dir

    hydra_dir = tmp_path / "hydra"
    monkeypatch.setattr(sys, "argv", ["eval", "logger=none", "run_dir=/proc/zoomr-run", f"hydra.run.dir={hydra_dir}",
                                      "hydra/job_logging=none", "hydra/hydra_logging=none"])  # fmt: skip
    level = logging.root.level
    try:
        with pytest.raises(SystemExit, match=r"run_dir=/proc/zoomr-run cannot be written \(.* in /proc\); give a writ"):
            main()
    finally:
        logging.root.setLevel(level)
    assert not hydra_dir.exists()
    check_run_dir(str(tmp_path)), check_run_dir(str(tmp_path / "new" / "run"))  # writable: passes, nothing left
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_run_record_is_kept_after_a_refusal_behind_the_lock_and_replaced_after_a_write_below(tmp_path):
    """A rerun refused after it took the run lock (a training or an eval with other settings: the most common
    refusal) rewrote ``.lock`` with its pid, so the directory counted as written and ``.hydra/`` kept the refused
    command's record; a run that wrote only below a subdirectory's top level counted as having written nothing."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from zoomr.entry import CONF_DIR, KeepRunRecord
    from zoomr.runlock import RunLock
    from zoomr.schemas import register_with_hydra

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (run / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1}')
    with RunLock(run):  # the finished run's lock file, with its pid
        pass
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("data_prep", overrides=[f"hydra.run.dir={run}"], return_hydra_config=True)
    held = HydraConfig.instance()
    saved = held.cfg
    try:
        held.set_config(cfg)

        def rerun(write):
            KeepRunRecord().on_run_start(cfg)
            (run / ".hydra" / "config.yaml").write_text("seed: 2\n")  # Hydra's record of the new command
            write()
            KeepRunRecord.restore()  # what hydra_entry calls when the run ends in a refusal or an error
            return (run / ".hydra" / "config.yaml").read_text()

        def refused_behind_the_lock():
            with RunLock(run):
                pass

        assert rerun(refused_behind_the_lock) == "seed: 1\n"
        deep = run / "checkpoints" / "checkpoint-1" / "trainer_state.json"
        assert rerun(lambda: deep.write_text('{"global_step": 12}')) == "seed: 2\n"
    finally:
        held.cfg = saved


def test_a_rerun_that_crashes_with_a_bug_leaves_the_runs_hydra_record(tmp_path, monkeypatch):
    """Only refusals, errors of the user's input and Ctrl-C put the earlier run's ``.hydra/`` back: a rerun ending in
    a bug's traceback before it wrote anything left Hydra's record of the crashed command. The traceback stays."""
    import zoomr.entry
    from data_prep.__main__ import main

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- +pipeline=summarize\n")
    (run / "config.json").write_text("{}")

    def bug(cfg, here=True):
        raise RuntimeError("a bug")

    monkeypatch.setattr(zoomr.entry, "check_run_settings", bug)
    monkeypatch.setattr(sys, "argv", ["data_prep", "+pipeline=summarize", "seed=7", f"hydra.run.dir={run}",
                                      "hydra/job_logging=none", "hydra/hydra_logging=none"])  # fmt: skip
    level = logging.root.level
    try:
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
            main()
    finally:
        logging.root.setLevel(level)
    assert "a bug" in err.getvalue()
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["overrides.yaml"]
    assert (run / ".hydra" / "overrides.yaml").read_text() == "- +pipeline=summarize\n"
