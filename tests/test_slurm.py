"""SLURM path without a cluster: a local submitit sweep really runs; the H100 launcher's sbatch text."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from zoomr.entry import CONF_DIR
from zoomr.launch import sbatch_text
from zoomr.schemas import register_with_hydra


def test_multirun_sweep_runs_through_local_submitit(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "train", "+method=sft", "data.max_samples=2", "method.max_length=128",
         "method.max_steps=1", "method.learning_rate=1e-4,3e-4", "hydra/launcher=submitit_local",
         f"hydra.sweep.dir={sweep}", "--multirun"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = sorted(sweep.rglob("summary.json"))
    assert len(summaries) == 2
    lrs = sorted(json.loads((s.parent / "config.json").read_text())["method"]["learning_rate"] for s in summaries)
    assert lrs == [1e-4, 3e-4]
    assert all(json.loads(s.read_text())["steps"] == 1 for s in summaries)
    assert list(sweep.rglob(".submitit/*"))  # submitit's own job folders: it really ran through submitit


def test_slurm_h100_sbatch_carries_the_requested_resources(monkeypatch):
    monkeypatch.setenv("SLURM_PARTITION", "h100-prod")
    monkeypatch.setenv("SLURM_ACCOUNT", "kvlab")
    monkeypatch.setenv("ZOOMR_SLURM_TIME_MIN", "720")
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["+method=sft", "hydra/launcher=slurm_h100", "hydra.launcher.nodes=2"],
                      return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    launcher = {k: v for k, v in launcher.items() if k not in ("submitit_folder", "name")}
    launcher = OmegaConf.to_container(OmegaConf.create(launcher), resolve=True)
    text = sbatch_text(launcher, "python -m train +method=sft", "/tmp/sub")
    for line in ["--partition=h100-prod", "--account=kvlab", "--time=720", "--nodes=2", "--gpus-per-node=8",
                 "--ntasks-per-node=1", "--cpus-per-task=96", "--mem=800GB"]:
        assert f"#SBATCH {line}" in text, line
    assert "srun" in text and "python -m train +method=sft" in text


@pytest.mark.slow  # model-loading subprocesses: CI stays under 15 min on a slow day
def test_a_slurm_sweep_without_srun_is_refused_in_one_line_before_any_job(tmp_path):
    """Without a cluster, ``hydra/launcher=slurm_h100 --multirun`` was submitit's ``Could not detect "srun"`` under
    Hydra's launcher traceback; the entry configs' ``launcher_check`` callback refuses it first."""
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "eval", "benchmark=aime25", "logger=none", "hydra/launcher=slurm_h100",
         f"hydra.sweep.dir={sweep}", "--multirun"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": os.path.dirname(sys.executable)},
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "hydra/launcher=slurm_h100 submits the jobs to SLURM, but this machine has no `srun`" in proc.stderr
    assert not sweep.exists()


def test_the_launcher_check_passes_where_srun_exists_and_for_local_launchers(tmp_path, monkeypatch):
    from zoomr.entry import LauncherCheck

    register_with_hydra()

    def config(launcher):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose("train", overrides=["+method=sft", f"hydra/launcher={launcher}"], return_hydra_config=True)

    assert config("slurm_h100").hydra.callbacks.launcher_check._target_ == "zoomr.entry.LauncherCheck"
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match="hydra/launcher=submitit_slurm submits the jobs to SLURM"):
        LauncherCheck().on_multirun_start(config("submitit_slurm"))
    LauncherCheck().on_multirun_start(config("submitit_local"))  # local launchers need no srun
    LauncherCheck().on_multirun_start(config("basic"))
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\n")
    srun.chmod(0o755)
    with pytest.raises(SystemExit, match="this machine has no `sbatch`"):  # was submitit's FileNotFoundError
        LauncherCheck().on_multirun_start(config("slurm_h100"))
    (tmp_path / "sbatch").symlink_to(srun)
    LauncherCheck().on_multirun_start(config("slurm_h100"))  # a login node: submitit takes over
    monkeypatch.setenv("ZOOMR_SLURM_TIME_MIN", "abc")  # was omegaconf's traceback from Hydra's launcher setup
    with pytest.raises(SystemExit, match=r"^hydra.launcher.timeout_min: [^\n]*ZOOMR_SLURM_TIME_MIN[^\n]*'abc'[^\n]*$"):
        LauncherCheck().on_multirun_start(config("slurm_h100"))


def _hydra_main(main, argv, monkeypatch):
    """Run an entry point's ``hydra.main`` in this process with ``argv``; logging is left as it was (Hydra's "none"
    logging configs; "disabled" turned every existing logger off for the tests after)."""
    import logging

    monkeypatch.setattr(sys, "argv", [*argv, "hydra/job_logging=none", "hydra/hydra_logging=none"])
    level = logging.root.level
    try:
        main()
    finally:
        logging.root.setLevel(level)


@pytest.mark.parametrize("entry, overrides, message", [
    ("eval", ["seed=5,-1"], r"--multirun job #1 \(seed=-1\): seed=-1: must be in \[0, 2\*\*32 - 1\]; no job was started"),
    ("eval", ["+method=h2o,snapkv", "device=cpu,tpu"], r"job #1 \(\+method=h2o device=tpu\): device=tpu: give auto"),
    ("eval", ["generation.n_samples=2,0", "run_name=full-${generation.n_samples}"],
     r"(?s)job #1 \(generation.n_samples=0\): invalid eval settings .*generation.n_samples must be >= 1, got 0"),
    ("eval", ["+method=h2o", "method.budget_rows=64,96"],
     r"jobs #0 \(method.budget_rows=64\) and #1 \(method.budget_rows=96\) would both write "
     r"run_dir=runs/eval/math500/tiny-qwen2/h2o: give each job its own run_name"),
    ("train", ["+method=sft", "method.max_steps=1,0"], r"job #1 \(method.max_steps=0\): invalid settings: SFTMethod: "),
    ("train", ["seed=1,2"], r"job #0 \(seed=1\): no method chosen"),
], ids=["seed", "device", "eval-settings", "shared-run-dir", "train-schema", "train-no-method"])  # fmt: skip
def test_a_sweep_with_a_bad_job_is_refused_before_any_job_starts(entry, overrides, message, tmp_path, monkeypatch):
    """A bad value in a ``--multirun`` was refused by its own job only: after the jobs before it had run (basic
    launcher), or after every job had been submitted (submitit: queued on SLURM), ending in submitit's
    ``UncompletedJobError`` traceback; two eval jobs differing outside ``run_name`` shared one run directory, the
    second refused there after its model had loaded. Every job is now composed and checked first."""
    import importlib

    main = importlib.import_module(f"{entry}.__main__").main
    sweep = tmp_path / "sweep"
    with pytest.raises(SystemExit, match=message):
        _hydra_main(main, [entry, "--multirun", *overrides, "logger=none", f"hydra.sweep.dir={sweep}"], monkeypatch)
    assert not sweep.exists()  # no multirun.yaml, no job directory


FAKE_SRUN = """#!/bin/bash
case "$*" in *hostname*) echo 10.0.0.1; exit 0;; esac
trap 'echo stopped >> "$FAKE_LOG"; exit 143' TERM
echo "$$" > "$FAKE_LOG.pid"
while :; do sleep 0.02; done
"""
FAKE_SCONTROL = """#!/bin/bash
case "$1" in show) echo node1;; *) echo "$*" >> "$FAKE_LOG";; esac
"""


def test_the_multinode_script_requeues_its_job_near_the_time_limit(tmp_path):
    """`--signal=USR1@120` sent USR1 to the job steps: torchrun and every rank, which do not handle it, died on the
    spot two minutes before the limit, and nothing requeued the job (the script's comment said a timeout requeued
    it). Now the batch shell alone gets it (B:), requeues the job, and waits for the training SLURM then stops."""
    import contextlib
    import signal
    import time

    from zoomr.paths import REPO_ROOT

    script = REPO_ROOT / "slurm" / "train_multinode.slurm"
    assert "#SBATCH --signal=B:USR1@" in script.read_text()
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log), "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1"}  # fmt: skip
    job = subprocess.Popen(["bash", str(script), "+method=abridge"], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                           text=True)  # fmt: skip
    try:
        pid_file, deadline = tmp_path / "calls.pid", time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the shell is in its wait
        job.send_signal(signal.SIGUSR1)  # SLURM, 120 s before the time limit
        while "requeue" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job.poll() is None, "the batch shell died of USR1"
        os.kill(int(pid_file.read_text()), signal.SIGTERM)  # SLURM stops the requeued job's steps
        err = job.communicate(timeout=10)[1]
    finally:
        if job.poll() is None:
            job.kill()
        if "stopped" not in (log.read_text() if log.exists() else ""):  # the fake training outlived the shell
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert log.read_text().splitlines() == ["requeue 42", "stopped"]
    assert "time limit near: requeueing job 42" in err and job.returncode == 143
