"""paper_tables on real tiny run directories: every table and figure its inputs allow, with the right rows,
and every absent or broken input named in the skip list / problems (never silently dropped)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra

register_with_hydra()
N_PROBLEMS, N_SAMPLES, NEW_TOKENS = 3, 2, 24
EVAL = [
    "benchmark=math500", f"benchmark.problem_limit={N_PROBLEMS}", f"generation.n_samples={N_SAMPLES}",
    f"generation.max_new_tokens={NEW_TOKENS}", "generation.batch_size=6", "grading.workers=1", "logger=none",
]  # fmt: skip


def _eval(run_dir: Path, cache_dir: str, *overrides: str) -> Path:
    from eval.__main__ import run

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("eval", overrides=[*EVAL, *overrides, f"run_dir={run_dir}", f"cache_dir={cache_dir}"])
    run(cfg)
    return run_dir


@pytest.fixture(scope="module")
def two_arms(tmp_path_factory, cache_dir) -> Path:
    """Full KV and StreamingLLM (48 rows) on 3 MATH-500 problems x 2 samples: real eval run directories."""
    root = tmp_path_factory.mktemp("runs")
    _eval(root / "eval" / "full", cache_dir)
    _eval(root / "eval" / "streaming", cache_dir, "+method=streaming", "method.budget_rows=48")
    return root


def _build(runs: list, out: Path, **kw):
    from analysis.paper_tables import build_all

    return build_all([str(r) for r in runs], out, n_resamples=200, **kw)


def _md_rows(path: Path) -> list[list[str]]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]


def test_two_eval_arms_give_table1_and_the_eval_figures(two_arms, tmp_path):
    out = tmp_path / "paper"
    report = _build([two_arms / "eval" / "*", tmp_path / "no-such-run"], out)
    rows = _md_rows(out / "abridge_table1_tiny-qwen2.md")
    assert [r[0] for r in rows] == ["full", "streaming"]  # arms named from their configs, full KV first
    assert rows[0][1] == "512" and float(rows[1][1]) < 512  # KV/512: StreamingLLM keeps fewer rows
    assert rows[0][4] == "ref" and rows[1][4].startswith(("+", "-"))
    assert float(rows[1][7]) <= 48 < float(rows[0][7])  # mean resident rows: StreamingLLM within its 48-row budget
    md = (out / "abridge_table1_tiny-qwen2.md").read_text()
    assert f"math500: {N_PROBLEMS} problems × {N_SAMPLES} samples, 2 arms" in md and str(two_arms / "eval" / "full") in md
    assert (out / "abridge_table1_tiny-qwen2.csv").read_text().splitlines()[0].startswith("Arm,KV/512")
    assert "\\begin{tabular}" in (out / "abridge_table1_tiny-qwen2.tex").read_text()
    for key in ("abridge_fig3a_tiny-qwen2", "abridge_fig3c_tiny-qwen2", "abridge_fig4a_tiny-qwen2"):
        assert (out / f"{key}.png").stat().st_size > 1000 and (out / f"{key}.pdf").stat().st_size > 1000, key
    fits = {r[0]: int(r[3]) for r in _md_rows(out / "abridge_fig3c_tiny-qwen2_table.md")}
    assert fits["streaming"] > fits["full"] > 0  # fewer resident bytes -> more sequences in 8 GiB
    skipped = {s["key"]: s["reason"] for s in report.skipped}
    for key in ("abridge_fig3b", "abridge_fig3d", "abridge_fig6", "kvzap_table1", "zoomr_ag_histogram"):
        assert key in skipped, key
    assert "no zoomr arm" in skipped["zoomr_table_tiny-qwen2"]
    readme = (out / "README.md").read_text()
    assert "no-such-run: matches no file or directory" in readme and "`abridge_fig6`" in readme
    manifest = json.loads((out / "manifest.json").read_text())
    assert {t["key"] for t in manifest["tables"]} >= {"abridge_table1_tiny-qwen2", "abridge_fig3c_tiny-qwen2_table"}


def test_incomplete_and_duplicate_runs_are_reported_by_name(two_arms, tmp_path):
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(two_arms / "eval" / "streaming", cut)
    lines = (cut / "results.jsonl").read_text().splitlines()
    (cut / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # one sample missing
    dup = tmp_path / "dup"
    shutil.copytree(two_arms / "eval" / "full", dup)
    from analysis.paper_tables.inputs import discover

    inputs = discover([str(two_arms / "eval" / "full"), str(cut), str(dup)])
    assert [a.label for a in inputs.evals] == ["full"]
    text = "\n".join(inputs.problems)
    assert f"{cut}: incomplete run, {N_PROBLEMS * N_SAMPLES - 1} of {N_PROBLEMS * N_SAMPLES} samples" in text
    assert f"{dup}: arm 'full' of tiny-qwen2 on math500 already read from" in text


def test_a_torn_run_config_is_reported_naming_the_file_and_the_rest_is_read(two_arms, tmp_path):
    """A torn ``config.json`` was reported as a bare ``JSONDecodeError`` of the run directory."""
    import shutil

    from analysis.paper_tables.inputs import discover

    torn = tmp_path / "torn"
    shutil.copytree(two_arms / "eval" / "streaming", torn)
    (torn / "config.json").write_text('{"run_name": "streaming",')
    (tmp_path / "bench.json").write_bytes(b"\xff\xfe not text")
    inputs = discover([str(two_arms / "eval" / "full"), str(torn), str(tmp_path / "bench.json")])
    assert [a.label for a in inputs.evals] == ["full"]
    text = "\n".join(inputs.problems)
    assert f"{torn}: unreadable ({torn / 'config.json'}: not valid JSON (expected a JSON run config;" in text
    assert f"{tmp_path / 'bench.json'}: not a UTF-8 text file (expected a JSON bench report)" in text


def test_inputs_none_of_which_is_usable_fail_the_run_naming_them(tmp_path):
    """Every input missing or unreadable ended with exit status 0 and "0 tables"."""
    from analysis.paper_tables import build_all

    with pytest.raises(SystemExit, match="none of the 1 inputs is a run directory or bench JSON it can read"):
        build_all([str(tmp_path / "typo")], tmp_path / "out")
    assert "typo: matches no file or directory" in (tmp_path / "out" / "README.md").read_text()


def test_paper_tables_task_composes_and_logs_tables_to_one_wandb_run(two_arms, tmp_path, monkeypatch):
    from analysis.paper_tables import run_task
    from zoomr.entry import to_plain

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("analysis", overrides=["+task=paper_tables", f"task.runs=[{two_arms}/eval/*]",
                                             f"task.out={tmp_path / 'out'}", "task.memory_gib=1", "logger=wandb"])  # fmt: skip
    for bad in (0, math.nan):  # NaN passed `memory_gib <= 0` and died in Figure 3c after writing Figure 3a
        with pytest.raises(SystemExit, match="memory_gib"):
            run_task({**to_plain(cfg.task), "memory_gib": bad}, {"mode": "disabled"})
    assert not (tmp_path / "out").exists()  # refused before writing anything
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    task = to_plain(cfg.task)
    task["n_resamples"] = 200
    report = run_task(task, to_plain(cfg.logger))
    assert "1 GiB" in (tmp_path / "out" / "abridge_fig3c_tiny-qwen2_table.md").read_text()
    (run_dir,) = (tmp_path / "out" / "wandb").glob("offline-run-*")
    media = {p.name for p in run_dir.rglob("*") if p.is_file()}
    assert sum(n.endswith(".table.json") for n in media) >= len(report.tables)  # + the skip list
    assert sum(n.endswith(".png") for n in media) == len(report.figures)


@pytest.mark.slow  # AbridgeKV train + allocation, a ZoomR arm, two benches: ~60-90 s on a busy 2-core machine
def test_every_input_kind_gives_its_tables_and_figures(two_arms, tmp_path, cache_dir):
    import analysis.bench_throughput as bench_throughput
    import train.abridge as abridge
    import train.abridge_allocate as allocate
    from tests.test_abridge_train import TINY_RUN, _compose

    runs = tmp_path / "runs"
    train_cfg = _compose("abridge", [*TINY_RUN, "method.max_steps=2", f"cache_dir={cache_dir}"], runs / "abridge")
    abridge.run(train_cfg)
    allocate.run(_compose("abridge_allocate", [f"method.checkpoint={runs / 'abridge' / 'final'}", "data.max_samples=8",
                                               "logger=none", f"cache_dir={cache_dir}"], runs / "alloc"))  # fmt: skip
    zoomr = _eval(runs / "eval" / "zoomr", cache_dir, "+method=zoomr", "method.window=16")
    report = bench_throughput.main(
        ["--batch-sizes", "1", "2", "--new-tokens", "8", "--prompt-tokens", "16", "--budget", "8", "--repeats", "1",
         "--policies", "full", "streaming", "--eval-runs", str(two_arms / "eval" / "full"), str(zoomr),
         "--requests", "3", "--finish-caps", "1", "2", "--out", str(runs / "bench")]
    )  # fmt: skip
    assert report["throughput"]["full"]["2"]["ratio_vs_full"] == 1.0
    assert [f["arm"] for f in report["finish"]] == ["full", "zoomr"]
    for f in report["finish"]:  # the arm's time is its fastest concurrency cap
        assert set(f["seconds_by_cap"]) == {"1", "2"} and f["seconds"] == min(f["seconds_by_cap"].values())
    out = tmp_path / "paper"
    result = _build([two_arms / "eval" / "*", runs], out)
    tables = {t["key"] for t in result.tables}
    figures = {f["key"] for f in result.figures}
    assert {"abridge_fig3b", "abridge_fig3d", "abridge_fig6", "zoomr_resident_kv_tiny-qwen2"} <= figures
    assert {"abridge_fig6_table", "abridge_fig3b_table", "abridge_fig3d_table", "zoomr_table_tiny-qwen2"} <= tables
    assert {r[0]: r[5] for r in _md_rows(out / "abridge_fig3d_table.md")}["full"] == "1.00"
    assert [r[0] for r in _md_rows(out / "zoomr_table_tiny-qwen2.md")] == ["full", "streaming", "zoomr"]
    skipped = {s["key"]: s["reason"] for s in result.skipped}
    assert "h2o, sumr" in skipped["zoomr_table_tiny-qwen2:missing_arms"]
    assert [int(r[2]) for r in _md_rows(out / "abridge_fig6_table.md")] == json.loads(
        (runs / "alloc" / "schedule.json").read_text()
    )["quotas"]
    throughput = {r[0] for r in _md_rows(out / "abridge_fig3b_table.md")}
    assert throughput == {"full", "streaming"}


def test_multi_competition_benchmark_gets_per_competition_columns(two_arms, tmp_path):
    """A suite-like run (rows from two competitions) adds one accuracy column per competition to Table 1."""
    import shutil

    for arm in ("full", "streaming"):
        shutil.copytree(two_arms / "eval" / arm, tmp_path / arm)
        path = tmp_path / arm / "results.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        first = rows[0]["problem_id"]
        for r in rows:
            r["competition"] = "comp_a" if r["problem_id"] == first else "comp_b"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "paper"
    _build([tmp_path / "full", tmp_path / "streaming"], out)
    header = (out / "abridge_table1_tiny-qwen2.csv").read_text().splitlines()[0].split(",")
    assert header[-2:] == ["math500:comp_a avg@k", "math500:comp_b avg@k"]
    assert all(len(r) == len(header) for r in _md_rows(out / "abridge_table1_tiny-qwen2.md"))


def test_arms_run_with_other_settings_are_refused_by_name_unless_allowed(two_arms, tmp_path):
    import shutil

    for arm in ("full", "streaming"):
        shutil.copytree(two_arms / "eval" / arm, tmp_path / arm)
    fp = tmp_path / "streaming" / "fingerprint.json"
    data = json.loads(fp.read_text())
    data["generation"]["max_new_tokens"] = 999  # as if the arm had run with another token cap
    fp.write_text(json.dumps(data))
    report = _build([tmp_path / "full", tmp_path / "streaming"], tmp_path / "out")
    skipped = {s["key"]: s["reason"] for s in report.skipped}
    assert "generation.max_new_tokens" in skipped["abridge_table1_tiny-qwen2"]
    assert not (tmp_path / "out" / "abridge_table1_tiny-qwen2.md").exists()
    _build([tmp_path / "full", tmp_path / "streaming"], tmp_path / "out2", allow_different_settings=True)
    md = (tmp_path / "out2" / "abridge_table1_tiny-qwen2.md").read_text()
    assert "Arms ran with different settings" in md and "max_new_tokens" in md


SLIM_ARMS = Path(__file__).resolve().parents[1] / "analysis/results/miniature/runs/arms"


def test_a_torn_results_row_is_reported_and_the_file_left_as_it_was(tmp_path):
    """A run whose last row is cut (being written, or killed mid-write) is an incomplete input; before, reading it
    truncated the run's results.jsonl (the evaluator's own repair on resume), so a table built over a running
    sweep could cut a row the run was still writing."""
    import shutil

    from analysis.paper_tables.inputs import discover

    run = tmp_path / "full"
    shutil.copytree(SLIM_ARMS / "full", run)
    results = run / "results.jsonl"
    torn = results.read_bytes()[:-40]
    results.write_bytes(torn)
    inputs = discover([str(run)])
    assert not inputs.evals
    assert [p for p in inputs.problems if "incomplete run, 255 of 256 samples done" in p]
    assert results.read_bytes() == torn


def test_the_runs_read_keep_no_per_row_text(tmp_path):
    """paper_tables held every row's text (and gold, extracted answer, testbed recall list) of every run it read until
    its tables were written, though no table reads them: gigabytes over a sweep of arms with long samples. The runs
    are read without them, to the same metrics."""
    import shutil

    from analysis.paper_tables.inputs import discover

    run = tmp_path / "full"
    shutil.copytree(SLIM_ARMS / "full", run)
    plain = discover([str(run)]).evals[0]
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    (run / "results.jsonl").write_text("".join(json.dumps({**r, "text": "long " * 200, "gold": "1", "extracted": "1",
                                                           "recall": [{"key": "k", "correct": True}]}) + "\n"
                                               for r in rows))  # fmt: skip
    arm = discover([str(run)]).evals[0]
    assert not {"text", "gold", "extracted", "recall"} & {k for r in arm.run.rows for k in r}
    assert arm.metrics == plain.metrics and arm.run.rows == plain.run.rows


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["benchmark"].update(task="bogus"), "not an evaluation run's config \\(unknown benchmark.task 'bogus'"),
        (lambda c: c.pop("generation"), "not an evaluation run's config \\(no 'generation' field\\)"),
        (lambda c: c["generation"].update(n_samples="2"), "generation.n_samples='2', not a positive integer"),
        (lambda c: c["generation"].update(n_samples=0), "generation.n_samples=0, not a positive integer"),
        (lambda c: c.update(model="mini-base"), "needs a 'model' object with a 'name'"),
        (lambda c: c.update(method="abridge"), "needs a 'model' object with a 'name', and a 'method' object"),
    ],
    ids=["unknown-task", "no-generation", "n_samples-str", "n_samples-0", "model-str", "method-str"],
)
def test_an_edited_run_config_is_an_unusable_input_named_by_its_file(tmp_path, edit, message):
    """Fields of another type or an unknown task in an eval run's config.json were ValueError / TypeError /
    AttributeError tracebacks that ended the whole command (n_samples=0: an empty arm, a numpy traceback after
    the first tables); the run is listed as unusable, naming its config.json, and the other inputs are read."""
    import shutil

    from analysis.paper_tables.inputs import discover

    for arm in ("full", "streaming"):
        shutil.copytree(SLIM_ARMS / arm, tmp_path / arm)
    config = json.loads((tmp_path / "streaming/config.json").read_text())
    edit(config)
    (tmp_path / "streaming/config.json").write_text(json.dumps(config))
    inputs = discover([str(tmp_path / "*")])
    assert [a.label for a in inputs.evals] == ["full"]
    assert len(inputs.problems) == 1
    assert inputs.problems[0].startswith(str(tmp_path / "streaming/config.json"))
    assert re.search(message, inputs.problems[0])


def test_a_bad_wandb_mode_is_refused_before_any_table_is_written(tmp_path, monkeypatch):
    """``python -m analysis.paper_tables --logger wandb`` with an unusable WANDB_MODE wrote every table and figure,
    then failed when the W&B run started; the mode is checked first now."""
    from analysis.paper_tables import main
    from zoomr.schemas.checks import SettingsError

    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(SettingsError, match="WANDB_MODE='bogus' is not a W&B mode"):
        main([str(SLIM_ARMS / "full"), "--out", str(tmp_path / "out"), "--logger", "wandb"])
    assert not (tmp_path / "out").exists()


def _drop_kind(rows: list) -> list:
    return [{k: v for k, v in r.items() if k != "kind"} for r in rows]


@pytest.mark.parametrize(
    "source, edit, field, message",
    [
        ("mini-abridge_c256_alloc-T1024", lambda d: {**d, "quotas": "abc"}, "allocations",
         "schedule.json: not a usable quota schedule (quotas is not a list of integers)"),
        ("mini-abridge_c256_alloc-T1024", lambda d: {k: v for k, v in d.items() if k != "costs"}, "allocations",
         "schedule.json: not a usable quota schedule (costs is not a list of 3 numbers"),
        ("mini-kvzap-T1024", _drop_kind, "kvzap_fits",
         "r2.json: not a usable KVzap fit report (entry 0: kind missing or of another type)"),
        ("mini-kvzap-T1024", lambda d: {"heads": d}, "kvzap_fits", "r2.json: not a usable KVzap fit report (a dict"),
        ("bench_throughput.json", lambda d: {**d, "finish": {"full": 1}}, "throughput",
         "bench_throughput.json: not a usable throughput bench (finish: a dict, not a list)"),
        ("agreeability_zoomr_writes.json", lambda d: {**d, "agreeability": "high"}, "zoomr_bench",
         "agreeability_zoomr_writes.json: not a usable ZoomR bench (agreeability is not a list of numbers)"),
    ],
    ids=["quotas-text", "no-costs", "r2-no-kind", "r2-object", "finish-object", "agreeability-text"],
)  # fmt: skip
def test_a_side_input_of_another_shape_is_an_unusable_input_not_a_traceback(tmp_path, source, edit, field, message):
    """A schedule.json, r2.json, bench_throughput.json or agreeability JSON that parses but has another shape was
    taken as an input and ended the command in a KeyError / TypeError / matplotlib or numpy ValueError traceback
    while drawing its figure, after the tables before it were written; it is listed as unusable, naming the file."""
    import shutil

    from analysis.paper_tables.inputs import discover

    committed, copy = SLIM_ARMS.parent / source, tmp_path / "runs" / source
    copy.parent.mkdir()
    (shutil.copytree if committed.is_dir() else shutil.copy)(committed, copy)
    file = copy / ("schedule.json" if "alloc" in source else "r2.json") if copy.is_dir() else copy
    file.write_text(json.dumps(edit(json.loads(file.read_text()))))
    inputs = discover([str(tmp_path / "runs" / "**")])
    assert getattr(inputs, field) == []
    assert [p for p in inputs.problems if p.startswith(str(file)) and message in p], inputs.problems
    if field == "allocations":  # the whole command: exit 0 with the figure skipped (a matplotlib traceback before)
        shutil.copytree(SLIM_ARMS / "full", tmp_path / "runs" / "full")
        _build([tmp_path / "runs" / "**"], tmp_path / "out")
        assert message in (tmp_path / "out" / "README.md").read_text()


def test_a_negative_resampling_seed_is_refused_before_anything_is_written(tmp_path):
    """task.seed=-1 passed the task's checks and ended in numpy's ValueError traceback at the first bootstrap, after
    the output directory was made; both entries refuse it first."""
    from analysis.paper_tables import main, run_task

    with pytest.raises(SystemExit, match=r"task.seed=-1 \(must be >= 0\)"):
        run_task({"runs": [str(SLIM_ARMS / "full")], "out": str(tmp_path / "hydra"), "seed": -1}, {})
    with pytest.raises(SystemExit, match="seed >= 0, got 8.0, 2000, -1"):
        main([str(SLIM_ARMS / "full"), "--out", str(tmp_path / "cli"), "--seed", "-1"])
    assert not list(tmp_path.iterdir())


def test_a_rerun_cut_short_leaves_no_torn_table_and_no_index_of_the_old_run(tmp_path, monkeypatch):
    """Tables, figures and the index were written in place: a rerun killed while writing a table left it torn or
    empty (a csv is opened before its rows are written) beside the previous run's README.md and manifest.json,
    which still listed it as made. Each file is renamed into place whole now, and the old index is removed before
    the rerun rewrites anything (the new one is written last)."""
    import csv

    from analysis.paper_tables.report import WRITING, Report

    out = tmp_path / "paper"
    first = Report(out)
    first.table("t1", "Table 1", ["arm", "acc"], [["full", 0.5]], ["run/full"], "1 problem")
    first.write_index({"counts": {}, "problems": [], "unused": []})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"t1.md", "t1.csv", "t1.tex", "README.md", "manifest.json"}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # stands in for a kill while the rows are written

    rerun = Report(out)
    rerun.table("t0", "Table 0", ["arm", "acc"], [["full", 0.25]], ["run/full"], "1 problem")
    monkeypatch.setattr(csv, "writer", killed)
    with pytest.raises(KeyboardInterrupt):
        rerun.table("t1", "Table 1", ["arm", "acc"], [["full", 0.75]], ["run/full"], "1 problem")
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name != WRITING}  # the record of what runs wrote
    assert set(after) == {"t0.md", "t0.csv", "t0.tex", "t1.md", "t1.csv", "t1.tex"}
    assert all(after[name] == before[name] for name in after if name.startswith("t1"))


def test_a_rerun_removes_the_tables_an_earlier_run_made_that_it_skips_and_no_other_file(tmp_path):
    """A rerun whose inputs no longer fed a table (listed as skipped in its new index) left the earlier run's table
    beside its fresh ones, for a reader to take as this run's; now the files an earlier run's index lists (or a run
    cut short recorded) that this run does not make are removed, and named in the index. Other files stay."""
    from analysis.paper_tables.report import WRITING, Report

    out, nothing = tmp_path / "paper", {"counts": {}, "problems": [], "unused": []}

    def table(report: Report, key: str) -> None:
        report.table(key, key, ["arm", "acc"], [["full", 0.5]], ["run/full"], "1 problem")

    first = Report(out)
    for key in ("t1", "t2"):
        table(first, key)
    first.write_index(nothing)
    (out / "notes.md").write_text("mine")
    cut = Report(out)  # a rerun cut short after its first table: the earlier index is gone, t3 is new
    table(cut, "t3")
    assert not (out / "manifest.json").exists() and (out / WRITING).exists()
    last = Report(out)
    table(last, "t1")
    last.skip("t2", "inputs absent")
    index = last.write_index(nothing)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "manifest.json", "notes.md", "t1.csv", "t1.md",
                                                      "t1.tex"]  # fmt: skip
    assert "## Removed (an earlier run's tables and figures this run did not make)" in index and "- t3.tex" in index
    assert json.loads((out / "manifest.json").read_text())["removed"] == [f"t{i}.{e}" for i in (2, 3)
                                                                          for e in ("csv", "md", "tex")]  # fmt: skip


def test_kvzap_arms_without_a_measured_compression_are_named_not_drawn_at_zero():
    """An arm whose runs never recorded ``kv_per_512_all`` (made before it was, or resumed across that version) was
    left out of the accuracy-vs-compression table without a word, and drawn at compression 0 (where full KV sits) in
    the per-subset figure; now it is drawn nowhere and the tables' note names it."""
    from types import SimpleNamespace

    from analysis.paper_tables.kvzap_paper import points, unmeasured_note

    def arm(label, pooled):
        return SimpleNamespace(label=label, method="kvzap", method_config={"threshold": -4}, pooled=pooled,
                               config={"benchmark": {"task": "math"}}, run=SimpleNamespace(rows=[], samples=1))  # fmt: skip

    measured = arm("kvzap_a", {"kv_per_512_all": 256.0, "accuracy": 0.5, "avg@k": 0.5})
    old = arm("kvzap_old", {"accuracy": 0.5, "avg@k": 0.5})
    assert unmeasured_note([measured]) == ""
    assert unmeasured_note([measured, old]) == ("Not drawn (no measured compression, `kv_per_512_all`; rerun to "
                                                "measure it): kvzap_old (τ=-4).")  # fmt: skip
    assert [a.label for a, *_ in points([measured, old])] == ["kvzap_a"]


def test_a_second_paper_tables_into_an_out_being_written_is_refused(tmp_path):
    """Two at once into one out (a sweep, or a rerun while the first is still writing): each removed the files its
    index did not list, the other's among them, and the index written last named files that were gone."""
    from analysis.paper_tables import build_all
    from zoomr.runlock import RunLock

    out = tmp_path / "out"
    with RunLock(out, "paper_tables"), pytest.raises(SystemExit, match=f"{out} is being written by another paper_tables"):
        build_all([str(tmp_path / "typo")], out)
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written, nothing removed
