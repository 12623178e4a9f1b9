"""The analysis scripts refuse impossible sizes and a missing checkpoint before loading anything (analysis/cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from analysis import testbed_pointer, testbed_table, zoomr_testbed
from analysis.cli import require_at_least, require_checkpoint

MODEL = str(Path(__file__).resolve().parents[1] / "analysis/results/zoomr_testbed/model")  # committed; the checks run before it is loaded


def test_require_at_least_names_every_option_below_its_bound(capsys):
    p = argparse.ArgumentParser(prog="x")
    args = argparse.Namespace(n=0, batches=[1, 0], window=None, top_k=3)
    with pytest.raises(SystemExit):
        require_at_least(p, args, 1, "n", "batches", "window", "top_k")
    assert "x: error: --n, --batches must be >= 1" in capsys.readouterr().err  # None (unset) and 3 pass
    require_at_least(p, args, 0, "n", "batches", "window")


def test_require_checkpoint_wants_a_config_json(tmp_path, capsys):
    p = argparse.ArgumentParser(prog="x")
    with pytest.raises(SystemExit):
        require_checkpoint(p, str(tmp_path))
    assert f"--model {tmp_path}: not a checkpoint directory (no config.json)" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    require_checkpoint(p, str(tmp_path))


@pytest.mark.parametrize(
    "main,argv,message",
    [
        (zoomr_testbed.main, ["--n", "0"], "--n must be >= 1"),  # was an IndexError after the model loaded
        (zoomr_testbed.main, ["--window", "-1"], "--window must be >= 0"),  # was a run on a negative window
        (testbed_pointer.main, ["--n", "0"], "--n must be >= 1"),  # wrote a hit-rate file of zero cues
        (testbed_pointer.main, ["--consensus", "-2"], "--consensus must be >= 0"),
        # the training stream as the test set: a ValueError traceback from the data check after the checks above
        (testbed_pointer.main, ["--test-seed", "0"], "data.test_seed=0 is the training stream's seed"),
        (testbed_table.main, ["--n", "0"], "--n must be >= 1"),  # testbed_table checked nothing
        (testbed_table.main, ["--fractions", "0.5", "1.5"], "--fractions [0.5, 1.5]: each must lie in (0, 1]"),
        (testbed_table.main, ["--trace-tokens", "10"], "trace_tokens=10 is too short"),  # was a traceback, out/ made
        (zoomr_testbed.main, ["--trace-tokens", "10"], "trace_tokens=10 is too short"),  # the same
    ],
)
def test_testbed_scripts_refuse_impossible_sizes(main, argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--model", MODEL, *argv, "--out", str(tmp_path / "out")])
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_zoomr_testbed_refuses_a_model_that_is_not_a_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit):
        zoomr_testbed.main(["--model", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "not a checkpoint directory" in capsys.readouterr().err


def test_testbed_table_and_the_loader_refuse_a_model_that_is_not_a_checkpoint(tmp_path, capsys):
    """``--model /nope`` reached the hub as a repo id ("Repo id must use alphanumeric chars")."""
    from zoomr.models import ModelPathError
    from zoomr.testbed.checkpoint import load_testbed_model

    with pytest.raises(SystemExit):
        testbed_table.main(["--model", str(tmp_path / "nope"), "--out", str(tmp_path / "out")])
    assert "not a checkpoint directory" in capsys.readouterr().err and not (tmp_path / "out").exists()
    with pytest.raises(ModelPathError, match=r"testbed checkpoint nope: no such directory"):
        load_testbed_model("nope")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["step", "--checkpoint", "x"], "--checkpoint applies to kv and parity"),  # step ignored it silently
        (["kv", "--checkpoint", "/nope"], "--checkpoint /nope: not a checkpoint directory"),
        (["step", "--repeats", "0"], "--repeats must be >= 1"),
        (["step", "--quota", "999"], "--quota 999 > --num-pause 16"),  # timed a mask keeping more rows than exist
        # sizes a part never reads: kv ran at C=64 K=16 (the random model's layout) without a word
        (["kv", "--block-size", "16", "--quota", "2"], "--block-size (step only), --quota (step only): not read by kv"),
        (["parity", "--repeats", "3", "--data", "testbed"], "--data (step only), --repeats (step only): not read by"),
        (["step", "--float64", "--new-tokens", "64"], "--float64 (parity only), --new-tokens (kv/parity only): not"),
    ],
)
def test_bench_abridge_refuses_what_it_cannot_measure(argv, message, tmp_path, capsys):
    from analysis import bench_abridge

    with pytest.raises(SystemExit):
        bench_abridge.main([*argv, "--out", str(tmp_path / "out.json")])
    assert message in capsys.readouterr().err and not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--generate", "0"], "--generate must be >= 1"),  # was an IndexError after the model loaded
        (["--generate", "270"], "--generate 270 must exceed one paragraph and its summary (250 + 20)"),  # the same
        (["--top-k", "0"], "--top-k must be >= 1"),  # was a ValueError traceback from the policy
        (["--window", "-1"], "--window must be >= 0"),
        (["--summary", "1"], "--summary must be >= 2"),  # a summary is its two delimiters at least: a traceback
    ],
)
def test_bench_zoomr_refuses_impossible_sizes(argv, message, tmp_path, capsys):
    from analysis import bench_zoomr

    with pytest.raises(SystemExit):
        bench_zoomr.main([*argv, "--out", str(tmp_path / "out.json")])
    assert message in capsys.readouterr().err and not (tmp_path / "out.json").exists()


def test_bench_abridge_testbed_step_uses_the_shipped_model_on_interleaved_testbed_streams():
    """``bench_abridge step --data testbed``: the shipped testbed model, streams with pause tokens after each block."""
    from types import SimpleNamespace

    import torch

    from analysis.bench_abridge import _step_streams
    from zoomr.abridge.layout import PAUSE, RAW, AbridgeLayout

    layout = AbridgeLayout(16, 4)
    model, tok, streams = _step_streams(SimpleNamespace(data="testbed", response_tokens=128, batch=2), layout, torch.device("cpu"))
    assert len(streams) == 2 and model.config.hidden_size == 128 and model.config.num_hidden_layers == 3
    for s in streams:  # K = 4 pauses after every completed block that more response follows
        assert s.kind.count(PAUSE) == 4 * ((s.kind.count(RAW) - 1) // 16) > 0


def test_a_script_prints_what_the_user_gave_wrong_alone_and_keeps_a_bugs_traceback(monkeypatch):
    """``python -m analysis.<script>`` showed a traceback for a missing or malformed input (the Hydra entry points
    printed the message alone); :func:`zoomr.script.run_script` ends every script the same way."""
    from zoomr.jsonl import BadRowError
    from zoomr.paths import MissingInput
    from zoomr.schemas.checks import SettingsError
    from zoomr.script import run_script

    def raising(error):
        def main():
            raise error

        return main

    monkeypatch.setattr("sys.argv", ["/repo/analysis/bench_abridge.py"])
    for error, text in ((MissingInput("no file x"), "bench_abridge: no file x"),
                        (BadRowError("x.json: not valid JSON"), "bench_abridge: x.json: not valid JSON"),
                        (SettingsError("n must be >= 1"), "bench_abridge: invalid settings: n must be >= 1")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            run_script(raising(error))
        assert e.value.code == text
    monkeypatch.setattr("sys.argv", ["/repo/analysis/paper_tables/__main__.py"])
    with pytest.raises(SystemExit, match="^paper_tables: no file"):
        run_script(raising(MissingInput("no file")))
    with pytest.raises(RuntimeError):  # a bug is not the user's: its traceback stays
        run_script(raising(RuntimeError("bug")))
    with pytest.raises(SystemExit) as e:
        run_script(lambda: 3)  # an int is the exit status (eval.compare returns one)
    assert e.value.code == 3
    run_script(lambda: {"report": 1})  # a report is not


def test_ctrl_c_ends_a_script_with_one_line_and_status_130(monkeypatch, capsys):
    """Ctrl-C in a script was a KeyboardInterrupt traceback through torch; now one line and the shell's status."""
    from zoomr.script import INTERRUPTED, run_script

    def main():
        raise KeyboardInterrupt

    monkeypatch.setattr("sys.argv", ["/repo/analysis/bench_decode.py"])
    with pytest.raises(SystemExit) as e:
        run_script(main)
    assert e.value.code == INTERRUPTED == 130
    assert capsys.readouterr().err.strip() == "bench_decode: interrupted"


def test_a_malformed_checkpoint_record_ends_a_script_with_its_message(tmp_path):
    import json
    import shutil
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(repo / "analysis/results/miniature/runs/mini-abridge_c256_alloc-T1024", ckpt, dirs_exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (ckpt / "abridge.json").write_text('{"layout": {"block_size": "big"}, "quotas": [1]}')
    proc = subprocess.run([sys.executable, "-m", "analysis.bench_abridge", "parity", "--checkpoint", str(ckpt)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert "bench_abridge: " in proc.stderr and "abridge.json: not the record +method=abridge writes" in proc.stderr



@pytest.mark.slow  # ~3 s: Hydra's main in this process (the check itself is tested below in 0.4 s)
def test_logger_wandb_on_an_analysis_task_that_logs_nothing_is_refused_before_it_runs(tmp_path, monkeypatch):
    """``python -m analysis +task=bench_zoomr logger=wandb`` ran the task, wrote its files and ended without a W&B
    run or a word about it (only paper_tables reads the logger config); now refused in one line before it runs."""
    import sys

    from analysis.__main__ import main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setattr(sys, "argv", ["analysis", "+task=bench_zoomr", "logger=wandb", f"hydra.run.dir={tmp_path / 'r'}",
                                      "hydra/job_logging=none", "hydra/hydra_logging=none"])  # fmt: skip
    with pytest.raises(SystemExit, match=r"logger=wandb: the analysis task 'bench_zoomr' logs nothing to W&B .*"
                                         r"then log the JSON it writes: python -m analysis.log_bench <file>$"):
        main()
    assert not (tmp_path / "r").exists()


def test_the_logger_check_passes_tasks_that_log_and_disabled_loggers_and_names_each_tasks_way(monkeypatch):
    from hydra import compose, initialize_config_dir

    from analysis.__main__ import check_logger
    from zoomr.entry import CONF_DIR
    from zoomr.schemas.checks import SettingsError

    monkeypatch.setenv("WANDB_MODE", "offline")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        def check(*overrides):
            check_logger(compose("analysis", overrides=list(overrides)))

        check("+task=paper_tables", "logger=wandb")
        check("+task=bench_zoomr")  # logger=none, the default
        with pytest.raises(SettingsError, match=r"task.args='\[--logger,wandb\]' logger=none$"):
            check("+task=bench_throughput", "logger=wandb")
        with pytest.raises(SettingsError, match=r"'miniature' logs nothing to W&B .*run it with logger=none$"):
            check("+task=miniature", "logger=wandb")
        monkeypatch.setenv("WANDB_MODE", "disabled")  # disabled wins: nothing is asked of W&B
        check("+task=bench_zoomr", "logger=wandb")


def test_bench_zoomr_shows_a_progress_bar_over_its_steps(tmp_path, capsys):
    """The lockstep loop (4,096 steps x 3 arms by default, minutes on a CPU) printed nothing until its table."""
    from analysis import bench_zoomr

    out = tmp_path / "rows.json"
    bench_zoomr.main(["--prompt", "8", "--generate", "30", "--para", "10", "--summary", "3", "--window", "4",
                      "--layers", "1", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert "bench_zoomr (3 arms in lockstep)" in err and "30/30" in err and out.exists()


@pytest.mark.parametrize("writer", ["report", "json"])
def test_a_bench_cut_short_while_writing_leaves_its_earlier_output_whole(tmp_path, monkeypatch, writer):
    import os

    from analysis.cli import write_bench_json, write_bench_report

    def write(report):
        if writer == "report":
            return write_bench_report(tmp_path, "bench", report, "| table |")
        return write_bench_json(tmp_path / "bench.json", "bench", "quick", report, "| table |")

    write({"rows": [1, 2, 3]})
    before = (tmp_path / "bench.json").read_text()

    def killed(src, dst):
        raise KeyboardInterrupt  # Ctrl-C between writing the new file and putting it in place

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write({"rows": [4]})
    assert (tmp_path / "bench.json").read_text() == before  # was truncated and rewritten in place
    monkeypatch.undo()
    write({"rows": [4]})
    assert '"rows"' in (tmp_path / "bench.json").read_text() and "4" in (tmp_path / "bench.json").read_text()
