"""AbridgeKV commands: the allocate -> per-layer hand-off composes into its own run directory (the old line lacked
``run_name=`` and ``resume=auto`` refused the uniform run's directory), and the parity bench prints PASS/FAIL."""

from __future__ import annotations

import shlex

from hydra import compose, initialize_config_dir

from train.abridge_allocate import next_command
from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra

register_with_hydra()


def _train(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=True)


def test_printed_per_layer_command_gets_its_own_run_directory():
    schedule = "runs/train/abridge_allocate-tiny-llama-traces/schedule.json"
    cmd = shlex.split(next_command("tiny-llama", "traces", schedule))
    assert cmd[:3] == ["python", "-m", "train"]
    per_layer = _train(cmd[3:])
    uniform = _train(["+method=abridge", "model=tiny-llama", "data=traces"])
    allocate = _train(["+method=abridge_allocate", "model=tiny-llama", "data=traces"])
    assert per_layer.method.schedule == schedule and per_layer.model.name == "tiny-llama"
    assert per_layer.hydra.run.dir != uniform.hydra.run.dir
    assert allocate.method.checkpoint == f"{uniform.hydra.run.dir}/final"  # allocation reads the uniform run
    # from a q = K model the doubled layer needs more code positions: the command carries them
    wider = _train(shlex.split(next_command("tiny-llama", "traces", schedule, num_pause=32))[3:])
    assert wider.method.num_pause == 32 and per_layer.method.num_pause == uniform.method.num_pause


def test_parity_bench_prints_a_verdict():
    from analysis.bench_abridge import parity_verdict

    good = {"max_abs_ce_diff": 3e-6, "wrong_over_parity": 5e3, "served_follows_compressing": 4, "disagreeing_tokens": 4}
    ok, line = parity_verdict([good, good])
    assert ok and line.startswith("PASS")
    ok, line = parity_verdict([good, {**good, "max_abs_ce_diff": 1e-3}])
    assert not ok and line.startswith("FAIL") and "0.001" in line
    assert not parity_verdict([{**good, "served_follows_compressing": 3}])[0]
