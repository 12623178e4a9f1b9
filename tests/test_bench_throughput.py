"""analysis.bench_throughput on the tiny model: tokens/s per policy and batch size, ratios to full KV, JSON +
table under --out, and bad arguments refused before anything is measured."""

from __future__ import annotations

import json
import re

import pytest

from analysis import bench_throughput


def test_throughput_table_and_json(tmp_path, cache_dir, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "bench"
    report = bench_throughput.main(
        ["--batch-sizes", "1", "2", "--new-tokens", "6", "--prompt-tokens", "10", "--budget", "6", "--repeats", "1",
         "--policies", "full", "streaming", "--cache-dir", cache_dir, "--out", str(out), "--logger", "wandb"]
    )  # fmt: skip
    saved = json.loads((out / "bench_throughput.json").read_text())
    assert saved["throughput"] == report["throughput"] and saved["finish"] == []
    for b in ("1", "2"):
        full, stream = report["throughput"]["full"][b], report["throughput"]["streaming"][b]
        assert full["ratio_vs_full"] == 1.0
        assert full["tokens_per_s"] == pytest.approx(int(b) * 6 / full["seconds"])
        assert stream["ratio_vs_full"] == pytest.approx(stream["tokens_per_s"] / full["tokens_per_s"])
    assert "| streaming |" in (out / "bench_throughput.md").read_text()
    assert list((out / "wandb").glob("offline-run-*"))  # offline by default: a local run to sync later
    assert report["wandb_summary"]["bench/tokens_per_s/streaming/b2"] == report["throughput"]["streaming"]["2"]["tokens_per_s"]


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_throughput.parse_args(["--budget", "500", "--prompt-tokens", "64", "--new-tokens", "64"])
    assert "never evicts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_throughput.parse_args(["--eval-runs", str(tmp_path / "missing")])
    assert "not evaluation run directories" in capsys.readouterr().err
    quick = bench_throughput.parse_args(["--quick"])
    assert quick.batch_sizes == [1, 8] and quick.new_tokens == 32 and quick.policies == ["full", "streaming", "h2o"]
    assert quick.finish_caps == [2, 8]
    # --quick filled what was given too (--finish-caps 1 4 ran 2 8; --finish-caps 0 ran instead of being refused), and an
    # unknown policy or model was a traceback after the model loaded
    given = bench_throughput.parse_args(["--quick", "--finish-caps", "1", "4", "--requests", "16", "--new-tokens", "48"])
    assert (given.finish_caps, given.requests, given.new_tokens, given.repeats) == ([1, 4], 16, 48, 1)
    for bad, message in [(["--quick", "--finish-caps", "0"], "must be >= 1"), (["--repeats", "0"], "must be >= 1"),
                         (["--quick", "--policies", "full", "bogus"], r"unknown policies \['bogus'\]"),
                         (["--model", "bogus"], "--model bogus: no conf/model/bogus.yaml")]:
        with pytest.raises(SystemExit):
            bench_throughput.parse_args(bad)
        assert re.search(message, capsys.readouterr().err), bad


def test_log_bench_puts_every_numeric_result_under_bench_keys(tmp_path, monkeypatch):
    from analysis.log_bench import main as log_bench

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    bench = tmp_path / "zoomr_rows.json"
    bench.write_text(json.dumps({"meta": {"generate": 512, "model": "tiny-qwen2"},
                                 "results": {"full": {"step_ms": 1.5, "offload": True}}, "agreeability": [0.5, None]}))  # fmt: skip
    (summary,) = log_bench([str(bench)])
    assert summary["bench/results/full/step_ms"] == 1.5 and summary["bench/agreeability/0"] == 0.5
    assert not any("offload" in k or "generate" in k for k in summary)  # bools and the config block stay out
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    with pytest.raises(SystemExit):
        log_bench([str(tmp_path / "missing.json")])


def test_log_bench_keys_a_list_of_rows_by_what_each_row_measures():
    """bench_decode's rows (and bench_train_step's, policy_overhead's, ...) reached W&B as bench/rows/7/step_ms: which
    policy, context and batch row 7 was could not be told from the dashboard."""
    from analysis.log_bench import flatten

    rows = [{"policy": p, "context": 1024, "batch": b, "step_ms": ms} for p, b, ms in (("full", 1, 2.0), ("h2o", 8, 1.5))]
    assert flatten({"rows": rows}) == {"rows/full-context1024-batch1/step_ms": 2.0,
                                       "rows/h2o-context1024-batch8/step_ms": 1.5}  # fmt: skip
    assert flatten({"results": [{"mode": "eager", "step_s": 0.4, "first_loss": 6.5}]}) == {
        "results/eager/step_s": 0.4, "results/eager/first_loss": 6.5}
    same = [{"policy": "full", "step_ms": 1.0}, {"policy": "full", "step_ms": 2.0}]  # not told apart: by position
    assert flatten({"rows": same, "agreeability": [0.5, None]}) == {
        "rows/0/step_ms": 1.0, "rows/1/step_ms": 2.0, "agreeability/0": 0.5}
@pytest.mark.parametrize("content, message", [("[]", "a bench JSON is an object, got list"),
                                              ('{"meta": {"model": "m"}, "ok": true}', "no numeric results to log")])  # fmt: skip
def test_log_bench_logs_nothing_when_a_later_file_cannot_be_logged(tmp_path, monkeypatch, content, message):
    """A bench JSON that parses but is not an object, or has no numeric result, was refused only when its turn came:
    the files before it had already been logged (a rerun logged them twice). Every file is checked first now."""
    from analysis import log_bench
    from zoomr.jsonl import BadRowError

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"results": {"step_ms": 3.0}}')
    bad.write_text(content)
    logged = []
    monkeypatch.setattr(log_bench, "log_summary_run", lambda **kw: logged.append(kw) or {})
    with pytest.raises(BadRowError, match=f"bad.json: {message}"):
        log_bench.main([str(good), str(bad), "--mode", "disabled"])
    assert not logged
    log_bench.main([str(good), "--mode", "disabled"])
    assert [kw["metrics"] for kw in logged] == [{"results/step_ms": 3.0}]


def test_a_slim_copy_is_timed_with_the_checkpoint_it_names_and_refused_without_it(tmp_path):
    """eval_requests: a slim copy (no model.hf_id; model.evaluated_checkpoint) decodes with that checkpoint when it
    is on disk, and is refused by name when it is not, rather than timing a model built from the config."""
    run = tmp_path / "arm"
    run.mkdir()
    rows = [{"prompt_tokens": 6, "n_tokens": 10 + i, "slim": True} for i in range(3)]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ckpt = tmp_path / "ckpt"
    (run / "config.json").write_text(json.dumps({"model": {"name": "m", "evaluated_checkpoint": str(ckpt)}}))
    with pytest.raises(SystemExit, match=r"slim copy whose checkpoint .*ckpt is not here"):
        bench_throughput.eval_requests(run, 2)
    ckpt.mkdir()
    config, requests = bench_throughput.eval_requests(run, 2)
    assert config["model"] == {"name": "m", "hf_id": str(ckpt)} and requests == [(6, 10), (6, 11)]


def test_logging_a_bench_file_again_resumes_its_wandb_run(tmp_path, monkeypatch):
    """``log_bench`` run twice on one file added a second W&B run of the same figures; now the same file (path and
    bytes) resumes its run, and a file rewritten by a new measurement is a new run."""
    from types import SimpleNamespace

    import wandb

    from analysis.log_bench import main as log_bench

    asked = []
    run = SimpleNamespace(summary={}, config=SimpleNamespace(update=lambda *a, **kw: None), finish=lambda: None)
    monkeypatch.setattr(wandb, "init", lambda **kw: asked.append(kw) or run)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    bench, other = tmp_path / "a.json", tmp_path / "b.json"
    for path in (bench, other):
        path.write_text(json.dumps({"meta": {"model": "tiny-qwen2"}, "results": {"step_ms": 1.5}}))
    log_bench([str(bench), str(other), "--mode", "offline"])
    log_bench([str(bench), "--mode", "offline"])
    bench.write_text(json.dumps({"meta": {"model": "tiny-qwen2"}, "results": {"step_ms": 2.5}}))
    log_bench([str(bench), "--mode", "offline"])
    ids = [kw["id"] for kw in asked]
    assert ids[0] == ids[2] and len(set(ids)) == 3 and all(kw["resume"] == "allow" for kw in asked)
