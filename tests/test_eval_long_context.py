"""The real entry point on the tiny default model for the long-context benchmarks: ``benchmark=ruler`` at a
small length and ``benchmark=longbench`` from a local directory produce per-subset scores, averages, and each
prompt's achieved compression (SnapKV here) in rows and metrics.json."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from analysis import paper_tables
from eval import longbench, ruler
from eval.__main__ import run
from eval.results import RESULTS_FILE
from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra

register_with_hydra()
COMMON = ["generation.n_samples=1", "generation.temperature=0", "generation.batch_size=11", "logger=none"]


def _run(run_dir: Path, cache_dir: str, *overrides: str) -> tuple[dict, list[dict]]:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("eval", overrides=[*COMMON, *overrides, f"run_dir={run_dir}", f"cache_dir={cache_dir}"])
    metrics = run(cfg)
    rows = [json.loads(line) for line in (run_dir / RESULTS_FILE).read_text().splitlines()]
    assert metrics == json.loads((run_dir / "metrics.json").read_text()) | {
        "grading_timeouts_this_run": metrics["grading_timeouts_this_run"]
    }
    return metrics, rows


RULER_SMALL = [
    "benchmark=ruler",
    "benchmark.length=1024",
    "benchmark.problem_limit=1",
    "generation.max_new_tokens=6",
]


def test_ruler_end_to_end_with_snapkv_and_kvzap_into_the_paper_tables(tmp_path, cache_dir, capsys):
    budget = 256
    metrics, rows = _run(
        tmp_path / "snapkv", cache_dir, *RULER_SMALL, "+method=snapkv", f"method.budget_rows={budget}"
    )
    r = metrics["ruler"]
    assert list(r["subsets"]) == list(ruler.SYNTHETIC) and len(rows) == 11
    assert r["average"] == pytest.approx(np.mean([m["score"] for m in r["subsets"].values()]))
    for row in rows:
        problem_answers = row["gold"].split(" | ")
        assert row["score"] == ruler.score(row["competition"], row["text"], problem_answers)  # 6 < budgets
        assert row["correct"] == (row["score"] == 1.0)
        prompt, n = row["prompt_tokens"], row["n_tokens"]
        target = 1024 - ruler.SUBSETS[row["competition"]].tokens_to_generate
        assert 0.9 * target < prompt <= target
        # SnapKV keeps `budget` prompt rows per head, then appends the generated tokens
        assert row["kv"]["prefill_compression"] == pytest.approx(1 - budget / prompt)
        assert row["kv"]["compression"] == pytest.approx(1 - (budget + n - 1) / (prompt + n - 1))
    assert r["compression"] == pytest.approx(np.mean([m["compression"] for m in r["subsets"].values()]))
    out = capsys.readouterr().out
    assert "niah_multikey_3" in out and "average" in out  # the per-subset table

    # KVzap (a random linear surrogate) through the same evaluator: input-adaptive compression per prompt
    from zoomr.kvzap.surrogate import new_surrogate

    new_surrogate(256, 2, 4).save_pretrained(tmp_path / "surrogates" / "linear")
    kv_metrics, kv_rows = _run(
        tmp_path / "kvzap", cache_dir, *RULER_SMALL, "+method=kvzap", f"method.surrogate_dir={tmp_path / 'surrogates'}",
        "method.model_type=linear", "method.threshold=0.0", "method.window=16",
    )  # fmt: skip
    per_prompt = [row["kv"]["compression"] for row in kv_rows]
    assert min(per_prompt) > 0 and len(set(per_prompt)) > 1

    # the paper tables read both runs (scope from problems.json) and plot RULER's score, not accuracy
    report = paper_tables.build_all([str(tmp_path / "snapkv"), str(tmp_path / "kvzap")], tmp_path / "paper")
    keys = {t["key"] for t in report.tables}
    assert {
        "kvzap_accuracy_vs_compression_tiny-qwen2_ruler_1024_table",
        "kvzap_subsets_tiny-qwen2_ruler_1024",
    } <= keys
    with open(tmp_path / "paper" / "kvzap_subsets_tiny-qwen2_ruler_1024.csv") as f:
        table = {line[0]: line for line in csv.reader(f)}
    assert (
        table["snapkv"][2] == f"{r['average']:.2f}"
        and table["snapkv"][-1] == f"{r['subsets']['fwe']['score']:.2f}"
    )
    kvzap_row = next(v for k, v in table.items() if k.startswith("kvzap"))
    assert kvzap_row[2] == f"{kv_metrics['ruler']['average']:.2f}"


def test_longbench_end_to_end_from_a_local_directory(tmp_path, cache_dir):
    data = tmp_path / "data"
    data.mkdir()
    rows = {
        "trec": {"input": "Where is Paris ?", "context": "Question: Who is he ?\nType: Human being\n",
                 "answers": ["City"], "all_classes": ["City", "Human being"], "length": 12, "_id": "t1"},
        "passage_count": {"input": "", "context": "Paragraph 1: a b.\n\nParagraph 2: a b.", "answers": [1],
                          "all_classes": None, "length": 10, "_id": "c1"},
    }  # fmt: skip
    for name, row in rows.items():
        (data / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    metrics, out = _run(
        tmp_path / "run", cache_dir, "benchmark=longbench", "benchmark.sources=[trec,passage_count]",
        f"benchmark.options.data_dir={data}", "generation.max_new_tokens=4",
    )  # fmt: skip
    m = metrics["longbench"]
    assert list(m["subsets"]) == ["trec", "passage_count"]
    assert m["average_without_trec"] == m["subsets"]["passage_count"]["score"]
    for row in out:
        sub = row["competition"]
        expect = longbench.score(
            sub, row["text"], [str(a) for a in rows[sub]["answers"]], rows[sub]["all_classes"]
        )
        assert row["score"] == expect
        assert row["kv"]["compression"] == pytest.approx(0.0)  # full KV removes nothing
