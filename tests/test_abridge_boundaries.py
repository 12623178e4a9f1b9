"""Recall at AbridgeKV block boundaries (analysis/abridge_boundaries.py): classes on the block grid and the report."""

from __future__ import annotations

import json

import pytest

from analysis.abridge_boundaries import boundary_report, main, query_class
from zoomr.testbed.grading import load_test_problems

OPTIONS = {"trace_tokens": 1024, "n_test": 48, "test_seed": 1_000_003}


def test_classes_follow_the_words_on_the_block_grid():
    """A fact straddles when its key ends a block (value opens the next); a cue query when its key is one of a
    block's last two tokens; checked against the words themselves."""
    seen = set()
    for rec in load_test_problems(OPTIONS):
        words = rec["response"].split(" ")
        for q in rec["queries"]:
            value = q["answer_pos"] - q["distance"]
            key = q["answer_pos"] - 3
            assert words[value - 1] == q["key"] and words[key] == q["key"] and words[key + 1 : key + 3] == [":", "="]
            c = query_class(q, 128)
            seen.add(c)
            assert (c == "fact_straddle") == ((value - 1) // 128 != value // 128)
            if c != "fact_straddle":
                assert (c == "query_straddle") == (key // 128 != (q["answer_pos"] - 1) // 128)
    assert seen == {"fact_straddle", "query_straddle", "inside"}

ROW = {"sample": 0, "competition": "testbed", "n_tokens": 1024, "truncated": False}  # a result row's other fields


def test_report_counts_misses_by_class_and_splits_problems(tmp_path):
    """A run that misses exactly the straddling facts: every other class at 0, the problems with a straddling
    final fact all wrong, the others all right."""
    recs = load_test_problems(OPTIONS)
    rows = []
    for rec in recs:
        recall = [{"key": q["key"], "correct": query_class(q, 128) != "fact_straddle"} for q in rec["queries"]]
        correct = all(r["correct"] for r, q in zip(recall, rec["queries"], strict=True) if q["final"])
        rows.append({**ROW, "problem_id": rec["id"], "correct": correct, "recall": recall})
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.json").write_text(json.dumps({"benchmark": {"options": OPTIONS}}))
    report = boundary_report(tmp_path, 128)
    by = report["by_class"]
    assert by["fact_straddle/intermediate"]["miss_rate"] == 1.0 and by["fact_straddle/intermediate"]["queries"] > 0
    assert by["inside/intermediate"]["missed"] == by["inside/final"]["missed"] == by["query_straddle/intermediate"]["missed"] == 0
    assert report["with_straddling_final_fact"]["problems"] > 0  # ~6% of problems at C = 128
    assert report["with_straddling_final_fact"]["answer_accuracy"] == 0.0
    assert report["without"]["answer_accuracy"] == 1.0
    assert report["with_straddling_final_fact"]["problems"] + report["without"]["problems"] == len(recs)


def test_cli_prints_a_table_and_writes_the_reports(tmp_path, capsys):
    """``main``: one table row per run, classes no run has left out, the JSON beside it; a bad C is refused."""
    recs = load_test_problems(OPTIONS)
    rows = [{**ROW, "problem_id": r["id"], "correct": True,
             "recall": [{"key": q["key"], "correct": True} for q in r["queries"]]} for r in recs]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.json").write_text(json.dumps({"benchmark": {"options": OPTIONS}}))
    main([str(tmp_path), "--block-size", "128", "--out", str(tmp_path / "out.json")])
    table = capsys.readouterr().out
    assert "| 1.000 |" in table and "missed: fact_straddle/final" in table
    assert "query_straddle/final" not in table  # 1,024-token traces: the final \boxed{} lies in the last block
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved[0]["answer_accuracy"] == 1.0 and saved[0]["without"]["problems"] > 0
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--block-size", "1"])


def test_a_run_of_other_problems_or_another_benchmark_is_refused_not_reported_as_zeros(tmp_path, capsys):
    """A run whose config names other test problems than its rows (an edited config, rows of another run), or no
    benchmark at all, had every row skipped: a report of 0 problems and no misses, written with exit 0. A run of
    another benchmark is refused by name too."""
    recs = load_test_problems(OPTIONS)
    rows = [{**ROW, "problem_id": r["id"], "correct": True,
             "recall": [{"key": q["key"], "correct": True} for q in r["queries"]]} for r in recs]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for config, message in (({"benchmark": {"task": "testbed", "options": {**OPTIONS, "test_seed": 3_000_017}}},
                             "none of its 48 finished rows is a test problem of the benchmark options"),
                            ({"model": {"name": "m"}}, "its config.json has no benchmark section"),
                            ({"benchmark": {"task": "math", "options": {}}}, "not a testbed evaluation run")):  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises(SystemExit, match=message):
            main([str(tmp_path), "--block-size", "128", "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()


def test_an_unfinished_run_is_refused_not_reported_over_the_problems_it_reached(tmp_path):
    """A run killed (or still writing) after 40 of its 48 problems was reported over those 40 without a word; a run
    limited by ``benchmark.problem_limit`` is finished at its limit."""
    recs = load_test_problems(OPTIONS)
    rows = [{**ROW, "problem_id": r["id"], "correct": True,
             "recall": [{"key": q["key"], "correct": True} for q in r["queries"]]} for r in recs[:40]]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.json").write_text(json.dumps({"benchmark": {"options": OPTIONS}}))
    with pytest.raises(SystemExit, match=rf"incomplete run, 40 of 48 test problems done \(first missing {recs[40]['id']}\)"):
        main([str(tmp_path), "--block-size", "128", "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()
    (tmp_path / "config.json").write_text(json.dumps({"benchmark": {"options": OPTIONS, "problem_limit": 40}}))
    assert boundary_report(tmp_path, 128)["problems"] == 40


def test_reports_cut_short_while_writing_leave_the_old_file_whole(tmp_path):
    """``--out`` was written in place: a kill mid-write left a torn JSON. It is renamed into place whole now."""
    from torn_writes import writes_torn

    recs = load_test_problems(OPTIONS)
    rows = [{**ROW, "problem_id": r["id"], "correct": True,
             "recall": [{"key": q["key"], "correct": True} for q in r["queries"]]} for r in recs]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.json").write_text(json.dumps({"benchmark": {"options": OPTIONS}}))
    out = tmp_path / "out.json"
    out.write_text("[]")
    with writes_torn("out.json"), pytest.raises(KeyboardInterrupt):
        main([str(tmp_path), "--block-size", "128", "--out", str(out)])
    assert out.read_text() == "[]" and sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "out.json", "results.jsonl"]
