"""The miniature reproduction's plan (issue 15): dependency order, commands that compose with Hydra as
written, the committed results in the issue's schema, and the report built from real eval run directories."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from analysis.miniature import checkpoint, done_file, ensure_model, eval_command, train_command
from analysis.miniature_plan import ARMS, MODELS, full_arm, plan
from zoomr.entry import CONF_DIR
from zoomr.paths import REPO_ROOT
from zoomr.schemas import register_with_hydra
from zoomr.schemas.analysis import MiniatureTask
from zoomr.schemas.checks import SettingsError

METHODS = {"full", "streaming", "h2o", "snapkv", "rkv", "rkv_serving", "evict_recency", "evict_random",
           "evict_attention", "kvzap", "kvzap_linear", "kvzip", "abridge", "zoomr", "sumr", "lightthinker"}  # fmt: skip


def test_plan_orders_dependencies_and_refuses_unknown_arms():
    models, arms = plan(["streaming", "h2o@zoomr"])
    assert arms.index("full") < arms.index("abridge") < arms.index("streaming")  # the match comes first
    assert arms.index("full_summaries") < arms.index("zoomr") < arms.index("h2o@zoomr")
    # the baselines match the per-layer model (AbridgeKV as the paper defines it), which needs every stage
    assert models.index("base") < models.index("abridge_c256_4to1") < models.index("abridge_c256_perlayer_more")
    assert "abridge_c256_8to1" not in models
    assert full_arm(ARMS["abridge"]) == "full" and full_arm(ARMS["sumr"]) == "full_summaries"
    with pytest.raises(ValueError, match="unknown miniature arm"):
        plan(["abridge_16to1"])


def test_the_default_plan_runs_every_method_and_leaves_the_c64_and_c128_variants_to_all_or_their_names():
    models, arms = plan([])
    assert {ARMS[a].method for a in arms} == METHODS and set(arms) == {a for a in ARMS if ARMS[a].default}
    assert not any(c in x for c in ("c64", "c128") for x in [*models, *arms])
    every_model, every_arm = plan(["all"])
    assert every_arm == plan(list(ARMS))[1] and set(every_arm) == set(ARMS)
    assert {"abridge_c64_4to1_more", "abridge_c64_perlayer_more"} <= set(every_model)
    with pytest.raises(ValueError, match="'all' runs every arm; give it alone"):
        plan(["all", "zoomr"])
    models, arms = plan(["streaming@abridge_c64"])  # a variant runs when named, with what it needs
    assert arms == ["full", "abridge_c64", "streaming@abridge_c64"] and "abridge_c64_perlayer_more" in models
    assert "abridge_c64_4to1_more" not in models


def test_the_c128_variant_is_the_main_c256_recipe_at_half_the_block_and_a_shorter_boundary_stage():
    models, arms = plan(["abridge_c128"])
    assert models == ["base", "abridge_c128_4to1", "abridge_c128_alloc", "abridge_c128_perlayer",
                      "abridge_c128_perlayer_boundary", "abridge_c128_perlayer_more"]
    for c128, c256 in [(f"abridge_c128_{m}", f"abridge_c256_{m}") for m in ("4to1", "8to1", "perlayer_more")]:
        a = _compose("train", train_command(c128, 1024)[3:])
        b = _compose("train", train_command(c256, 1024)[3:])
        assert b.method.block_size == 256 and b.method.max_steps == a.method.max_steps
        assert b.method.quota == (None if a.method.quota is None else 2 * a.method.quota)  # the same ratio C / q
        # 8:1 at C = 256 runs as many pause tokens as it keeps (K = q), at C = 128 half of the 4:1 model's K
        assert b.method.num_pause == (b.method.quota if c256.endswith("8to1") else 2 * a.method.num_pause)
    a = _compose("train", train_command("abridge_c128_perlayer_boundary", 1024)[3:])
    b = _compose("train", train_command("abridge_c256_perlayer_boundary", 1024)[3:])
    assert (a.data.boundary_period, a.data.boundary_rate) == (128, 1.0)
    assert b.method.max_steps == 2 * a.method.max_steps  # half the boundaries per trace: as many straddles seen
    assert a.method.schedule == "runs/train/mini-abridge_c128_alloc-T1024/schedule.json"
    assert ARMS["abridge_c128"].extra["ratio"] == 4 and ARMS["abridge_c128_8to1"].extra["ratio"] == 8
    assert ARMS["abridge"].extra["steps"] == 6000 and ARMS["abridge_c128"].extra["steps"] == 4500
    assert ARMS["streaming@abridge_c128"].match == ARMS["rkv@abridge_c128"].match == "abridge_c128"
    assert ARMS["rkv_serving@abridge_c128"].match_scale == ARMS["rkv_serving"].match_scale == 1.12
    assert "snapkv@abridge_c128" not in ARMS and ARMS["snapkv"].match == "abridge"


def _compose(entry: str, args: list[str]):
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(entry, overrides=[a for a in args if not a.startswith("logger=")])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_command_composes(name):
    cmd = train_command(name, 1024)
    cfg = _compose(cmd[2], cmd[3:])
    assert cfg.get("method") is not None or cfg.get("pipeline") is not None


@pytest.mark.parametrize("name", sorted(ARMS))
def test_every_arm_command_composes(name):
    task = MiniatureTask(n=8, test_seed=2_000_003)
    cmd = eval_command(ARMS[name], task, 100.0 if ARMS[name].match else None)
    cfg = _compose("eval", cmd[3:])
    assert cfg.benchmark.options.test_seed == 2_000_003 and cfg.benchmark.options.n_test == 8
    assert (cfg.method.name if cfg.get("method") else "full") in METHODS | {"kvzap"}
    assert ARMS[name].method in METHODS
    if ARMS[name].match:
        assert f"method.budget_rows={max(8, round(100 * ARMS[name].match_scale))}" in shlex.join(cmd)


def test_abridge_trains_at_c256_on_its_own_allocation_and_the_evictors_keep_a_quarter_of_its_blocks():
    models, _ = plan(["abridge"])
    assert models == ["base", "abridge_c256_4to1", "abridge_c256_alloc", "abridge_c256_perlayer",
                      "abridge_c256_perlayer_boundary", "abridge_c256_perlayer_more"]
    uniform = _compose("train", train_command("abridge_c256_4to1", 1024)[3:]).method
    assert (uniform.block_size, uniform.num_pause, uniform.quota) == (256, 64, 64)  # 4:1
    alloc = _compose("train", train_command("abridge_c256_alloc", 1024)[3:]).method
    assert alloc.checkpoint == "runs/train/mini-abridge_c256_4to1-T1024/final"
    second = _compose("train", train_command("abridge_c256_perlayer_boundary", 1024)[3:])
    third = _compose("train", train_command("abridge_c256_perlayer_more", 1024)[3:])
    for stage in (second, third):
        assert (stage.method.block_size, stage.method.num_pause, stage.method.quota) == (256, 128, None)
        assert stage.method.schedule == "runs/train/mini-abridge_c256_alloc-T1024/schedule.json"
        assert stage.method.optim.learning_rate == 5e-4
    assert second.method.init_from == "runs/train/mini-abridge_c256_perlayer-T1024/final"
    assert third.method.init_from == "runs/train/mini-abridge_c256_perlayer_boundary-T1024/final"
    assert (second.data.seed, third.data.seed) == (1, 2)  # fresh problems in each stage
    # block-boundary data in the second stage only, on the model's own block grid
    assert (second.data.boundary_period, second.data.boundary_rate) == (256, 1.0)
    first = _compose("train", train_command("abridge_c256_perlayer", 1024)[3:])
    assert first.data.boundary_rate == third.data.boundary_rate == 0.0
    eight = _compose("train", train_command("abridge_c256_8to1", 1024)[3:]).method
    assert (eight.block_size, eight.num_pause, eight.quota) == (256, 32, 32)  # 8:1, K = q as at 4:1
    assert ARMS["abridge_8to1"].extra["ratio"] == 8 and ARMS["abridge"].extra["ratio"] == 4
    assert ARMS["abridge_uniform"].extra["ratio"] == 4 and "schedule" not in ARMS["abridge_uniform"].extra
    for e, block in [(e, b) for e in ("evict_recency", "evict_random", "evict_attention") for b in (256, 128, 64)]:
        cmd = eval_command(ARMS[e if block == 256 else f"{e}_c{block}"], MiniatureTask(n=8, test_seed=2_000_003), None)
        method = _compose("eval", cmd[3:]).method
        assert (method.name, method.block_size, method.quota) == (e, block, block // 4)


def test_kvzap_fits_the_base_models_own_pairs_from_other_problems_and_its_arms_serve_those_surrogates():
    pairs = _compose("data_prep", train_command("kvzap_pairs", 1024)[3:])
    fit = _compose("train", train_command("kvzap", 1024)[3:])
    base = str(checkpoint("base", 1024))
    assert pairs.model.hf_id == fit.model.hf_id == base  # the base model's own hidden states
    assert pairs.pipeline.testbed.seed < 1_000_003  # a training stream; test seeds are 1,000,003 and up
    assert fit.method.pairs_dir == pairs.pipeline.out_dir  # the fit reads what the pipeline writes
    thresholds = {a.extra["threshold"] for a in ARMS.values() if a.method in ("kvzap", "kvzap_linear")}
    assert len(thresholds) >= 4  # the issue's grid: at least four thresholds per surrogate
    for name in ("kvzap@-5", "kvzap_linear@-5"):
        cmd = eval_command(ARMS[name], MiniatureTask(n=8, test_seed=2_000_003), None)
        method = _compose("eval", cmd[3:]).method
        assert method.surrogate_dir == fit.method.surrogate_dir and method.threshold == -5
        assert method.model_type == ("linear" if name.startswith("kvzap_linear") else "mlp")
        assert method.decoding and method.window == 128  # the paper's window, pruning in prefill and decoding


def test_lightthinker_trains_as_long_as_a_uniform_abridgekv_stage():
    """The two compressing fine-tunes get the same steps (200 before 2026-12-05: 0.627 against 0.955 on validation)."""
    lt = _compose("train", train_command("lightthinker", 1024)[3:]).method
    uniform = _compose("train", train_command("abridge_c256_4to1", 1024)[3:]).method
    assert lt.max_steps == uniform.max_steps == 1500
    assert lt.init_from == uniform.init_from == "runs/train/mini-base-T1024/final"  # both from the base model


def test_committed_results_follow_the_issue_schema():
    results = json.loads((REPO_ROOT / "analysis/results/miniature/results.json").read_text())
    assert {"test_seed", "n_problems", "trace_tokens"} <= set(results["meta"])
    names = [a["name"] for a in results["arms"]]
    assert len(names) == len(set(names)) and {"full", "abridge", "zoomr", "sumr", "lightthinker"} <= set(names)
    for a in results["arms"]:
        assert a["method"] in METHODS
        assert 0 <= a["answer_accuracy"] <= 1 and a["rows_over_full"] > 0
        low, high = a["ci_vs_full"]
        assert low <= a["delta_vs_full"] <= high
    full = next(a for a in results["arms"] if a["name"] == "full")
    assert full["rows_over_full"] == 1.0 and full["ci_vs_full"] == [0.0, 0.0]
    assert all("ratio" in a for a in results["arms"] if a["method"] == "abridge")
    assert "selection_hit_rate" in next(a for a in results["arms"] if a["name"] == "zoomr")
    # the selection run measured the paper's rule: its hit rate is not reported for the variants (c = 3, ...)
    assert not any("selection_hit_rate" in a for a in results["arms"] if a["method"] == "zoomr" and a["name"] != "zoomr")


def test_a_cached_model_is_reused_only_from_the_same_command_and_dependencies(tmp_path, monkeypatch):
    """ensure_model: the trainer runs when a model is missing, has no record (a run from before records: the
    trainer's own guard decides) or its command changed; a model made from an older dependency is refused."""
    import analysis.miniature as mini

    monkeypatch.chdir(tmp_path)
    ran: list[str] = []

    def fake_train(cmd, threads=None, what=""):  # stands in for the real trainer, whose guard tests/test_train_resume.py runs
        name = what.split()[-1]
        ran.append(name)
        done = done_file(name, 1024)
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps({"run": len(ran)}))

    monkeypatch.setattr(mini, "run_command", fake_train)
    task = SimpleNamespace(dry_run=False, trace_tokens=1024, threads=1)
    ensure_model("base", task)
    ensure_model("base", task)
    assert ran == ["base"]  # the second call reused it
    record = done_file("base", 1024).parent / mini.MODEL_RECORD
    saved = json.loads(record.read_text())
    assert saved["command"] == train_command("base", 1024)[1:] and saved["needs"] == {}
    record.write_text(json.dumps({**saved, "command": saved["command"] + ["method.max_steps=1"]}))
    ensure_model("base", task)  # the recipe changed: back to the trainer (it refuses other settings itself)
    record.unlink()
    ensure_model("base", task)  # no record: the trainer's guard decides, then the record is written
    assert ran == ["base"] * 3 and json.loads(record.read_text()) == saved

    ensure_model("abridge_c128_4to1", task)
    ensure_model("abridge_c128_4to1", task)
    assert ran[3:] == ["abridge_c128_4to1"]
    done_file("base", 1024).write_text(json.dumps({"run": "retrained"}))  # the base model trained again
    with pytest.raises(SystemExit, match=r"abridge_c128_4to1 .* was made from an earlier base"):
        ensure_model("abridge_c128_4to1", task)
    assert ran[3:] == ["abridge_c128_4to1"]


def test_an_arm_evaluated_on_an_earlier_version_of_its_model_is_refused(tmp_path, monkeypatch):
    """ensure_arm records the digest of its model's done file when it evaluates; a finished arm whose model was
    trained again since (same path: the eval command is unchanged) is refused instead of reused, and one
    evaluated without a model on disk (slim copies) is reused as it is."""
    import analysis.miniature as mini

    monkeypatch.chdir(tmp_path)
    evaluated: list[str] = []

    def fake_run_arm(cmd, run_dir, threads=None, quiet=False):  # the real evaluator: the next tests
        if not (run_dir / "metrics.json").exists():
            evaluated.append(run_dir.name)
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "metrics.json").write_text("{}")

    monkeypatch.setattr(mini, "run_arm", fake_run_arm)
    task = MiniatureTask(n=8, out="runs/miniature", threads=1, arm_lanes=1)
    mini.ensure_arm("full", task)  # no model on disk: evaluated, no record
    assert evaluated == ["full"] and not (mini.arm_dir(task, "full") / mini.ARM_RECORD).exists()
    done = done_file(ARMS["abridge_8to1"].model, 1024)
    done.parent.mkdir(parents=True)
    done.write_text('{"run": 1}')
    mini.ensure_arm("abridge_8to1", task)
    mini.ensure_arm("abridge_8to1", task)  # same model: reused
    assert evaluated == ["full", "abridge_8to1"]
    assert json.loads((mini.arm_dir(task, "abridge_8to1") / mini.ARM_RECORD).read_text())["model"] == ARMS["abridge_8to1"].model
    done.write_text('{"run": 2}')  # the model trained again at the same path
    with pytest.raises(SystemExit, match=r"arm abridge_8to1 .* was evaluated on an earlier abridge_c256_8to1.*move"):
        mini.ensure_arm("abridge_8to1", task)
    assert evaluated == ["full", "abridge_8to1"]


def test_an_arm_killed_after_its_metrics_still_records_its_model(tmp_path, monkeypatch):
    """An arm whose eval was killed (or failed) after writing metrics.json but before run_arm saved its command was
    evaluated again and reused without a record of its model (the record was written only when metrics.json was
    new): after a retrain of the model the arm was reused without a word. The record is written before the eval."""
    import analysis.miniature as mini
    import eval.arms

    monkeypatch.chdir(tmp_path)
    kills = [True]

    def run_command(cmd, threads=None, what="", log=None):  # the evaluator: killed once, after writing its metrics
        run_dir = Path(next(a for a in cmd if a.startswith("run_dir=")).split("=", 1)[1])
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.json").write_text("{}")
        if kills and kills.pop():
            raise SystemExit("killed")

    monkeypatch.setattr(eval.arms, "run_command", run_command)
    monkeypatch.setattr(eval.arms, "load_arm", lambda run_dir: None)
    task = MiniatureTask(n=8, out="runs/miniature", threads=1, arm_lanes=1)
    done = done_file(ARMS["abridge_8to1"].model, 1024)
    done.parent.mkdir(parents=True)
    done.write_text('{"run": 1}')
    with pytest.raises(SystemExit, match="killed"):
        mini.ensure_arm("abridge_8to1", task)
    mini.ensure_arm("abridge_8to1", task)  # the rerun finishes it
    done.write_text('{"run": 2}')  # the model trained again at the same path
    with pytest.raises(SystemExit, match=r"arm abridge_8to1 .* was evaluated on an earlier abridge_c256_8to1.*move"):
        mini.ensure_arm("abridge_8to1", task)


def test_the_start_line_says_what_is_left_and_how_long_it_should_take(tmp_path, monkeypatch):
    """From scratch the default command takes ≈ 2.5 h here, which a newcomer learned only from the README."""
    from analysis.miniature import arm_dir, expected_time
    from analysis.miniature_plan import ARM_MINUTES, TRAIN_MINUTES
    from eval.arms import COMMAND_FILE

    monkeypatch.chdir(tmp_path)
    models, arms = plan([])
    task = MiniatureTask(out="runs/miniature")
    assert set(models) == set(TRAIN_MINUTES)  # every default model has a measured time
    expect = sum(TRAIN_MINUTES.values()) + len(arms) * ARM_MINUTES
    assert f"12 models to train, 40 arms to evaluate; expect ≈ {expect:.0f} min" in expected_time(models, arms, task)
    done_file("base", 1024).parent.mkdir(parents=True)
    done_file("base", 1024).write_text("{}")
    (arm_dir(task, "full")).mkdir(parents=True)
    (arm_dir(task, "full") / "metrics.json").write_text("{}")  # finished, and of the command it would run now:
    (arm_dir(task, "full") / COMMAND_FILE).write_text(json.dumps(eval_command(ARMS["full"], task, None)[1:]))
    left = expect - TRAIN_MINUTES["base"] - ARM_MINUTES
    assert f"11 models to train, 39 arms to evaluate; expect ≈ {left:.0f} min" in expected_time(models, arms, task)
    no_training = MiniatureTask(out="runs/miniature", train=False)
    assert f"0 models to train, 39 arms to evaluate; expect ≈ {39 * ARM_MINUTES:.0f} min" in expected_time(
        models, arms, no_training)
    assert "+ 12 models never timed" in expected_time(*plan(["all"]), task)
    assert expected_time(models, arms, MiniatureTask(n=64)).endswith(
        "(times were measured at task.trace_tokens=1024, task.n=256, task.threads=2 only)")


def test_an_arm_directory_of_another_model_is_refused_before_anything_trains(tmp_path, monkeypatch):
    """A finished arm directory made under the arm names before 2026-12-06 (``abridge`` was the uniform model) was
    evaluated again only after every model trained, and refused then by the evaluator's settings check inside the
    arm's log; it is named before anything runs, with what the name meant. An old name is refused with its new one."""
    import shutil

    import analysis.miniature as mini
    from eval.arms import COMMAND_FILE

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs/miniature"
    shutil.copytree(REPO_ROOT / "analysis/results/miniature/runs/arms/full", out / "arms/full")
    shutil.copytree(REPO_ROOT / "analysis/results/miniature/runs/arms/abridge_uniform", out / "arms/abridge")
    cmd = json.loads((out / "arms/abridge" / COMMAND_FILE).read_text())
    (out / "arms/abridge" / COMMAND_FILE).write_text(json.dumps([a.replace("abridge_uniform", "abridge") for a in cmd]))
    monkeypatch.setattr(mini, "ensure_model", lambda *a: pytest.fail("a model trained before the refusal"))
    with pytest.raises(SystemExit, match=r"abridge: runs/miniature/arms/abridge holds a run of "
                       r"runs/train/mini-abridge_c256_4to1-T1024/final, the arm evaluates "
                       r"runs/train/mini-abridge_c256_perlayer_more-T1024/final \(arm names changed on 2026-12-06: "
                       r"what was called abridge is abridge_uniform now"):
        mini.run_task({"arms": ["abridge"], "train": True, "out": "runs/miniature"})
    (out / "arms/abridge").rename(out / "arms/abridge_uniform")  # what the rename asks for (run_name aside)
    with pytest.raises(SystemExit, match="checkpoints are missing: abridge"):  # the next check: nothing stale
        mini.run_task({"arms": ["abridge"], "train": False, "out": "runs/miniature"})
    with pytest.raises(SettingsError, match=r"\['abridge_perlayer'\] \(arm names changed on 2026-12-06: what was "
                       r"called abridge_perlayer is abridge now"):
        plan(["abridge_perlayer"])


def test_a_rerun_of_some_arms_merges_into_the_full_table(tmp_path, capsys):
    """``python -m analysis.miniature_report --merge``: arms of the same name replaced in place, new ones appended,
    the models recorded; a rerun on other problems is refused and the table is left as it was."""
    from analysis.miniature_report import main

    full = json.loads((REPO_ROOT / "analysis/results/miniature/results.json").read_text())
    (tmp_path / "results.json").write_text(json.dumps(full))
    zoomr = next(a for a in full["arms"] if a["name"] == "zoomr")
    rerun = {"meta": {**{k: full["meta"][k] for k in ("test_seed", "n_problems", "trace_tokens")},
                      "models": {"base_sum_cue": "runs/train/new/final"}},
             "arms": [{**zoomr, "answer_accuracy": 0.5}, {**zoomr, "name": "zoomr_new"}]}  # fmt: skip
    (tmp_path / "rerun.json").write_text(json.dumps(rerun))
    main(["--merge", str(tmp_path / "rerun.json"), "--into", str(tmp_path)])
    merged = json.loads((tmp_path / "results.json").read_text())
    names = [a["name"] for a in merged["arms"]]
    assert names == [a["name"] for a in full["arms"]] + ["zoomr_new"]
    assert merged["arms"][names.index("zoomr")]["answer_accuracy"] == 0.5
    assert merged["arms"][0] == full["arms"][0] and merged["meta"]["models"]["base_sum_cue"] == "runs/train/new/final"
    assert "| zoomr_new |" in (tmp_path / "table.md").read_text() and (tmp_path / "pareto.png").exists()
    other = {**rerun, "meta": {**rerun["meta"], "test_seed": 3_000_017}}
    (tmp_path / "other.json").write_text(json.dumps(other))
    before = (tmp_path / "results.json").read_text()
    with pytest.raises(SystemExit):
        main(["--merge", str(tmp_path / "other.json"), "--into", str(tmp_path)])
    assert "not on the same problems (test_seed: 2000003 vs 3000017)" in capsys.readouterr().err
    assert (tmp_path / "results.json").read_text() == before
    (tmp_path / "torn.json").write_text('{"meta": ')  # a rerun killed while writing its results.json
    (tmp_path / "armless.json").write_text(json.dumps({"meta": rerun["meta"]}))
    for bad, message in (("torn.json", "torn.json: not valid JSON"), ("armless.json", "the rerun is not a miniature")):
        with pytest.raises(SystemExit):
            main(["--merge", str(tmp_path / bad), "--into", str(tmp_path)])
        assert message in capsys.readouterr().err
    assert (tmp_path / "results.json").read_text() == before


@pytest.mark.parametrize(
    "arm, message",
    [
        (1, "an arm is not an object: 1"),
        ({"name": "x"}, "arm 'x': method, paired_with not a string"),
        ({"answer_accuracy": "high"}, "arm 'full': answer_accuracy not a number"),
        ({"ci_vs_full": [0.1]}, r"arm 'full': ci_vs_full=\[0.1\], not a \[low, high\] pair"),
    ],
    ids=["not-an-object", "no-method", "text-accuracy", "one-sided-ci"],
)
def test_a_merged_arm_the_table_cannot_draw_is_refused_before_anything_is_written(tmp_path, capsys, arm, message):
    """An arm row of the rerun's results.json that is not an object, or lacks a field the table and figures draw
    (or has one of another type), was a KeyError / TypeError / ValueError traceback; it is refused naming the arm
    and the field, and the table is left as it was."""
    from analysis.miniature_report import main

    full = json.loads((REPO_ROOT / "analysis/results/miniature/results.json").read_text())
    (tmp_path / "results.json").write_text(json.dumps(full))
    bad = {**full["arms"][0], **arm} if isinstance(arm, dict) and "name" not in arm else arm
    (tmp_path / "rerun.json").write_text(json.dumps({"meta": full["meta"], "arms": [bad]}))
    with pytest.raises(SystemExit):
        main(["--merge", str(tmp_path / "rerun.json"), "--into", str(tmp_path)])
    assert re.search(f"the rerun is not a miniature results.json \\({message}", capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rerun.json", "results.json"]


def test_arm_lanes_start_a_matched_arm_only_after_its_match_and_never_exceed_the_lanes(tmp_path, monkeypatch):
    """ensure_arms with 2 lanes: every arm runs once, quietly, with threads // lanes threads; at most 2 at a
    time; an arm given another arm's rows starts after that arm finished. (run_arm stands in for the evaluator
    here; the next test runs the real one.)"""
    import threading
    import time

    import analysis.miniature as mini

    events, active, peak, lock = [], [0], [0], threading.Lock()

    def fake_run_arm(cmd, run_dir, threads=None, quiet=False):
        name = next(a for a in ARMS if mini.arm_dir(task, a) == run_dir)
        with lock:
            events.append(("start", name, threads, quiet))
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05 if name != "abridge" else 0.3)
        with lock:
            active[0] -= 1
            events.append(("end", name, threads, quiet))

    monkeypatch.setattr(mini, "run_arm", fake_run_arm)
    monkeypatch.setattr(mini, "load_arm", lambda d: SimpleNamespace(rows=SimpleNamespace(mean=lambda: 100.0)))
    task = MiniatureTask(n=8, out=str(tmp_path), threads=2, arm_lanes=2)
    _, arms = plan(["streaming", "h2o", "evict_recency", "evict_random"])
    mini.ensure_arms(arms, task)
    starts = [e[1] for e in events if e[0] == "start"]
    ends = [e[1] for e in events if e[0] == "end"]
    assert sorted(starts) == sorted(arms) and peak[0] == 2
    assert all(e[2] == 1 and e[3] for e in events)
    order = [(e[0], e[1]) for e in events]
    for matched in ("streaming", "h2o"):
        assert order.index(("end", "abridge")) < order.index(("start", matched))
    assert starts.index("evict_recency") < ends.index("abridge")  # unmatched arms ran beside the slow one


def test_arm_lanes_run_the_real_evaluator_side_by_side(tmp_path, monkeypatch):
    """Two lanes on the real evaluator (the shipped testbed model, 4 short problems): both arms finish, their
    output is in arm.log, and the matched arm got its match's measured mean rows."""
    import analysis.miniature as mini
    from analysis.miniature_plan import Arm
    from eval.arms import load_arm

    monkeypatch.setitem(mini.ARMS, "h2o@full", Arm("h2o@full", "h2o", "base", match="full"))
    monkeypatch.setattr(mini, "checkpoint", lambda model, tokens: REPO_ROOT / "analysis/results/miniature/base_model")
    task = MiniatureTask(n=4, trace_tokens=128, out=str(tmp_path), threads=2, arm_lanes=2, batch_size=4)
    mini.ensure_arms(["full", "h2o@full"], task)
    full, h2o = load_arm(mini.arm_dir(task, "full")), load_arm(mini.arm_dir(task, "h2o@full"))
    assert len(full.ids) == len(h2o.ids) == 4
    log = (mini.arm_dir(task, "h2o@full") / "arm.log").read_text()
    assert log.startswith("$ python -m eval") and f"method.budget_rows={max(8, round(full.rows.mean()))}" in log
    assert "== eval testbed" in log  # the evaluator's own end-of-run summary went to the log


def test_pareto_labels_never_overlap_and_stay_at_their_point_when_there_is_room():
    from analysis.miniature_report import label_positions

    points = [(0.30, 1.0), (0.31, 0.99), (0.35, 0.98), (0.9, 0.99), (0.30, 0.5)]
    where = label_positions(points, 0.17, 0.03)
    assert where[0] == points[0] and where[3] == points[3] and where[4] == points[4]  # room: beside the point
    assert all(x == px and y <= py for (x, y), (px, py) in zip(where, points))  # only ever moved down
    for i, (x, y) in enumerate(where):
        for u, v in where[i + 1:]:
            assert abs(x - u) >= 0.17 or abs(y - v) >= 0.03 - 1e-12


def test_the_pareto_front_holds_exactly_the_arms_no_other_arm_dominates():
    import json

    from analysis.miniature_report import pareto_front

    arms = json.loads((REPO_ROOT / "analysis/results/miniature/results.json").read_text())["arms"]
    front = pareto_front(arms)

    def dominated(a):
        return any(b["rows_over_full"] <= a["rows_over_full"] and b["answer_accuracy"] >= a["answer_accuracy"]
                   and (b["rows_over_full"], b["answer_accuracy"]) != (a["rows_over_full"], a["answer_accuracy"])
                   for b in arms)  # fmt: skip

    def point(a):
        return a["rows_over_full"], a["answer_accuracy"]

    assert {point(a) for a in arms if not dominated(a)} == {point(a) for a in front}  # arms at one point: one of them
    assert [a["rows_over_full"] for a in front] == sorted(a["rows_over_full"] for a in front)
    assert front[-1]["answer_accuracy"] == max(a["answer_accuracy"] for a in arms)


def test_without_training_the_table_is_rebuilt_from_finished_arm_dirs_and_a_missing_checkpoint_is_refused(
    tmp_path, monkeypatch
):
    """``task.train=false``: the committed slim copies of finished arms (no checkpoint on disk) give back the
    committed table's figures; an arm with no finished run whose checkpoint is missing is refused before anything
    runs or is written."""
    import shutil

    from analysis.miniature import run_task

    monkeypatch.chdir(tmp_path)
    for arm in ("full", "kvzip"):
        shutil.copytree(REPO_ROOT / "analysis/results/miniature/runs/arms" / arm, tmp_path / "runs/miniature/arms" / arm)
    task = {"arms": ["kvzip"], "train": False, "out": "runs/miniature"}
    results = run_task(task)
    committed = {a["name"]: a for a in json.loads((REPO_ROOT / "analysis/results/miniature/results.json").read_text())["arms"]}
    assert [a["name"] for a in results["arms"]] == ["full", "kvzip"]
    for a in results["arms"]:
        for key in ("answer_accuracy", "rows_over_full", "recall", "delta_vs_full"):
            assert a[key] == pytest.approx(committed[a["name"]][key], abs=1e-12)
    assert not Path("runs/train").exists()  # nothing trained
    (tmp_path / "runs/miniature/arms/kvzip/metrics.json").unlink()
    (tmp_path / "runs/miniature/table.md").unlink()
    with pytest.raises(SystemExit, match=r"kvzip \(runs/train/mini-base-T1024/final\)"):
        run_task(task)
    assert not (tmp_path / "runs/miniature/table.md").exists()


def test_without_training_a_finished_arm_of_another_command_needs_its_checkpoint(tmp_path, monkeypatch):
    """``task.train=false task.n=128`` over finished arms of 256 problems: they counted as finished (metrics.json), so
    the missing checkpoints were not refused up front; each arm's evaluation started and failed inside its arm.log
    ("arm full failed"), and the start line said 0 arms to evaluate. Now refused before anything runs, naming them."""
    import shutil

    from analysis.miniature import run_task

    monkeypatch.chdir(tmp_path)
    for arm in ("full", "kvzip"):
        shutil.copytree(REPO_ROOT / "analysis/results/miniature/runs/arms" / arm, tmp_path / "runs/miniature/arms" / arm)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(SystemExit, match=r"no finished run of the command .* missing: full \(runs/train/mini-base-T1024"):
        run_task({"arms": ["kvzip"], "train": False, "out": "runs/miniature", "n": 128})
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no arm.log, no eval run state


def test_the_whole_committed_table_is_rebuilt_from_the_slim_copies_under_any_out(tmp_path):
    """Every committed arm (``task.arms=[all]``, variants included) is read back from its slim copy without a
    checkpoint or a decode, in a directory other than the one it ran in, and gives the committed figures. Before,
    the copies under another ``task.out`` were evaluated again (the recorded command names its run_dir), and the
    C = 64 copies, recorded before their models were renamed, never matched (runs/README.md)."""
    import shutil

    from analysis.miniature import run_task

    out = tmp_path / "elsewhere"
    shutil.copytree(REPO_ROOT / "analysis/results/miniature/runs/arms", out / "arms")
    before = {p: p.read_bytes() for p in (out / "arms").glob("*/results.jsonl")}
    results = run_task({"arms": ["all"], "train": False, "out": str(out)})
    committed = {a["name"]: a for a in json.loads((REPO_ROOT / "analysis/results/miniature/results.json").read_text())["arms"]}
    assert sorted(a["name"] for a in results["arms"]) == sorted(committed)
    for a in results["arms"]:
        for key in ("answer_accuracy", "rows_over_full", "recall", "delta_vs_full"):
            assert a[key] == pytest.approx(committed[a["name"]][key], abs=1e-12), (a["name"], key)
    assert {p: p.read_bytes() for p in (out / "arms").glob("*/results.jsonl")} == before  # nothing was decoded
    assert not list((out / "arms").glob("*/arm.log"))


def test_a_damaged_arm_record_is_named_instead_of_a_traceback(tmp_path):
    """The recorded command of a finished arm was parsed with ``json.loads`` (a torn file: a JSONDecodeError
    traceback) and written in place (a kill could tear it); it is written through a rename now and a damaged one
    is named."""
    import shutil

    from eval.arms import COMMAND_FILE, run_arm
    from zoomr.jsonl import BadRowError

    arm = tmp_path / "full"
    shutil.copytree(REPO_ROOT / "analysis/results/miniature/runs/arms/full", arm)
    cmd = [sys.executable, *json.loads((arm / COMMAND_FILE).read_text())]
    assert run_arm(cmd, arm).correct.mean() > 0.9  # reused: nothing runs
    (arm / COMMAND_FILE).write_text('["-m", "eval",')
    with pytest.raises(BadRowError, match=f"{COMMAND_FILE}: not valid JSON \\(expected a JSON arm command"):
        run_arm(cmd, arm)


def test_arms_that_hold_fewer_problems_than_task_n_are_named_instead_of_a_bootstrap_traceback(tmp_path):
    """Two finished arms whose results.jsonl were cut to the same 200 problems (by hand) reached the paired bootstrap
    with an index matrix for task.n = 256: a ValueError traceback from eval.bootstrap."""
    import shutil

    from analysis.miniature import summarize

    for arm in ("full", "kvzip"):
        d = tmp_path / "arms" / arm
        shutil.copytree(REPO_ROOT / "analysis/results/miniature/runs/arms" / arm, d)
        rows = (d / "results.jsonl").read_text().splitlines(keepends=True)
        (d / "results.jsonl").write_text("".join(rows[:200]))
    task = MiniatureTask(out=str(tmp_path), n=256)
    with pytest.raises(SystemExit, match=r"arm full \(.*arms/full\) holds 200 problems, not task.n=256"):
        summarize(["full", "kvzip"], task)


def test_a_report_cut_short_while_writing_leaves_the_old_results_json_whole(tmp_path):
    """``write_report`` wrote ``results.json`` in place: a kill mid-write (here: the file's write stops half-way) left
    it torn, and the next ``--merge`` into that table was refused, the arms of the earlier runs lost. Each file is
    renamed into place whole now."""
    from torn_writes import writes_torn

    from analysis.miniature_report import write_report

    old = (REPO_ROOT / "analysis/results/miniature/results.json").read_text()
    (tmp_path / "results.json").write_text(old)
    results = json.loads(old)
    with writes_torn("results.json"), pytest.raises(KeyboardInterrupt):
        write_report({**results, "arms": results["arms"][:2]}, tmp_path)
    assert (tmp_path / "results.json").read_text() == old
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("where", ["the table", "the rerun"])
def test_an_arm_listed_twice_is_refused_before_anything_is_written(tmp_path, capsys, where):
    """A table listing ``zoomr`` twice kept its second, old row beside the merged one (two zoomr rows, one stale); a
    rerun listing it twice merged only the last, without a word."""
    from analysis.miniature_report import main

    full = json.loads((REPO_ROOT / "analysis/results/miniature/results.json").read_text())
    zoomr = next(a for a in full["arms"] if a["name"] == "zoomr")
    twice = {**full, "arms": [*full["arms"], {**zoomr, "answer_accuracy": 0.25}]}
    rerun = {"meta": full["meta"], "arms": [{**zoomr, "answer_accuracy": 0.5}]}
    table, rerun = (twice, rerun) if where == "the table" else (full, {**rerun, "arms": [*rerun["arms"], zoomr]})
    (tmp_path / "results.json").write_text(json.dumps(table))
    (tmp_path / "rerun.json").write_text(json.dumps(rerun))
    with pytest.raises(SystemExit):
        main(["--merge", str(tmp_path / "rerun.json"), "--into", str(tmp_path)])
    assert f"{where} is not a miniature results.json (arm 'zoomr' is listed 2 times)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rerun.json", "results.json"]
