"""Issue 18, defect 4 and 8: bad JSONL rows are counted and skipped with their file and line, or the file
is refused naming the row; never a traceback from a parser and never a fake gold answer. A JSON file a user
points at (a quota schedule, a run's config) is refused naming the file and where the parser stopped."""

from __future__ import annotations

import json
import re

import pytest

from data_prep.traces import load_trace_rows
from eval.benchmarks import load_source
from eval.compare import main as compare_main
from eval.results import RESULTS_FILE, ResultStore
from zoomr.abridge.quotas import load_schedule
from zoomr.jsonl import BadRowError, JsonlReader, read_json_object

GOOD_TURNS = [{"from": "user", "value": "Q"}, {"from": "assistant", "value": "A"}]


def _write(path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_reader_counts_every_kind_of_bad_line_with_its_line_number(tmp_path):
    p = tmp_path / "x.jsonl"
    _write(p, [b'{"a": 1}', b"\xff\xfe not utf-8", b"null", b"", b"[1, 2]", b"{oops", b'"text"', b'{"a": 2}'])
    reader = JsonlReader(p)
    assert [(n, r["a"]) for n, r in reader] == [(1, 1), (8, 2)]
    assert [(b.line, b.reason.split(" (")[0]) for b in reader.bad] == [
        (2, "not_utf8"), (3, "not_an_object"), (5, "not_an_object"), (6, "bad_json"), (7, "not_an_object")
    ]  # fmt: skip
    assert reader.rows == 7 and str(reader.bad[0]) == f"{p} line 2: not_utf8"
    with pytest.raises(BadRowError, match=r"x\.jsonl line 2: not_utf8"):
        list(JsonlReader(p, on_bad="refuse"))


def test_a_utf8_byte_order_mark_is_not_a_bad_first_row(tmp_path):
    """A file saved with a BOM (Windows editors) lost its first row as bad_json, and a JSON file was refused."""
    p = tmp_path / "x.jsonl"
    _write(p, [b'\xef\xbb\xbf{"a": 1}', b'\xef\xbb\xbf{"a": 2}'])  # only the file's first bytes are a BOM
    reader = JsonlReader(p)
    assert [(n, r["a"]) for n, r in reader] == [(1, 1)] and [b.line for b in reader.bad] == [2]
    (tmp_path / "x.json").write_bytes(b'\xef\xbb\xbf{"a": 1}')
    assert read_json_object(tmp_path / "x.json") == {"a": 1}


def test_trace_loader_skips_non_utf8_null_and_string_turns(tmp_path):
    p = tmp_path / "t.jsonl"
    good = json.dumps({"conversations": GOOD_TURNS}).encode()
    string_turn = json.dumps({"conversations": ["user: Q", {"from": "assistant", "value": "A"}]}).encode()
    _write(p, [good, b'{"conversations": [\xff]}', b"null", string_turn, b"[]", good])
    rows, report = load_trace_rows(path=str(p), format="bespoke")
    assert len(rows) == 2 and report.rows == 6 and report.kept == 2
    assert report.defects["not_utf8"] == 1
    assert report.defects["not_an_object"] == 2
    assert report.defects["turn_not_an_object"] == 1
    p2 = tmp_path / "sky.jsonl"
    _write(p2, [b"null", json.dumps({"question": "Q", "code": ["<|begin_of_thought|>x"]}).encode(), b"\x80"])
    rows, report = load_trace_rows(path=str(p2))
    assert len(rows) == 1 and report.rows == 3 and report.defects["not_utf8"] == 1


def _math500_dir(tmp_path, rows: list[bytes]):
    (tmp_path / "math500").mkdir(parents=True)
    _write(tmp_path / "math500" / "test.jsonl", rows)
    return tmp_path


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"problem": "P", "unique_id": "b"}, r"line 2: no field 'answer'"),
        ({"problem": "P", "unique_id": "b", "answer": None}, r"line 2: the answer is null"),
        ({"problem": "P", "unique_id": "b", "answer": "  "}, r"line 2: the answer is empty"),
        ({"problem": "P", "answer": "3"}, r"line 2: no field 'unique_id'"),
    ],
)
def test_benchmark_row_without_a_gold_answer_refuses_the_file(tmp_path, bad, message):
    good = {"problem": "P", "unique_id": "a", "answer": "1"}
    data = _math500_dir(tmp_path, [json.dumps(good).encode(), json.dumps(bad).encode()])
    with pytest.raises(BadRowError, match=r"math500/test\.jsonl " + message):
        load_source("math500", data)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"problem": None, "unique_id": "b", "answer": "2"}, r"line 2: the problem is null"),
        ({"problem": " \n", "unique_id": "b", "answer": "2"}, r"line 2: the problem is empty"),
        ({"problem": ["P"], "unique_id": "b", "answer": "2"}, r"line 2: the problem is \[\"P\"\]"),
    ],
)
def test_benchmark_row_without_a_problem_statement_refuses_the_file(tmp_path, bad, message):
    """A null problem was evaluated as the prompt "None" (a silently meaningless sample)."""
    good = {"problem": "P", "unique_id": "a", "answer": "1"}
    data = _math500_dir(tmp_path, [json.dumps(good).encode(), json.dumps(bad).encode()])
    with pytest.raises(BadRowError, match=r"math500/test\.jsonl " + message):
        load_source("math500", data)


def test_benchmark_file_with_an_unreadable_line_is_refused(tmp_path):
    data = _math500_dir(tmp_path, [b'{"problem": "P", "unique_id": "a", "answer": "1"}', b"null"])
    with pytest.raises(BadRowError, match="line 2: not_an_object"):
        load_source("math500", data)
    ok = _math500_dir(tmp_path / "ok", [b'{"problem": "P", "unique_id": "a", "answer": 2.0}'])
    assert [p.answer for p in load_source("math500", ok)] == ["2"]


def _row(pid: str, sample: int = 0, **kw) -> dict:
    return {"problem_id": pid, "sample": sample, "competition": "c", "n_tokens": 3, "truncated": False, "correct": False,
            "grade_method": "none", "kv": {"rows_mean": 2.5}, **kw}  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"n_tokens": float("nan")}, "n_tokens=nan"),
        ({"n_tokens": "many"}, "n_tokens='many'"),
        ({"n_tokens": -1}, "n_tokens=-1"),
        ({"truncated": "no"}, "a boolean truncated"),
        ({"competition": None}, "a string competition"),
        ({"kv": {"rows_mean": None}}, "kv={'rows_mean': None}"),
        ({"kv": {"rows_mean": float("inf")}}, "needs finite numbers"),
        ({"recall_accuracy": 1.5}, "recall_accuracy=1.5"),
    ],
)
def test_a_hand_edited_result_row_is_skipped_naming_the_field(tmp_path, caplog, edit, message):
    """Such rows were averaged as they stood (a NaN or text n_tokens: a numpy traceback in eval.compare; a null
    kv value: that sample left out of the resident-KV mean without a word)."""
    _write(tmp_path / RESULTS_FILE, [json.dumps(_row("a")).encode(), json.dumps(_row("b", **edit)).encode()])
    store = ResultStore(tmp_path, fsync=False)
    assert set(store.load(repair=False)) == {("a", 0)} and store.bad == 1
    assert "line 2: not a result row (" in caplog.text and message in caplog.text


def test_result_store_skips_non_utf8_and_empty_object_lines(tmp_path):
    lines = [json.dumps(_row("a")).encode(), b"\xff\xfe", b"{}", b'{"problem_id": "c", "sample": "0"}',
             json.dumps(_row("b")).encode()]  # fmt: skip
    _write(tmp_path / RESULTS_FILE, lines)
    store = ResultStore(tmp_path, fsync=False)
    assert set(store.load()) == {("a", 0), ("b", 0)} and store.bad == 3 and store.torn == 0
    store.append(_row("c"))  # the key of an unreadable line is simply done again
    assert set(ResultStore(tmp_path).load()) == {("a", 0), ("b", 0), ("c", 0)}


def test_a_row_whose_grading_failed_is_replaced_by_a_later_row(tmp_path):
    store = ResultStore(tmp_path, fsync=False)
    store.load()
    store.append(_row("a", grade_method="error"))
    store.append(_row("a", correct=True, grade_method="math_verify"))  # the regrade
    with pytest.raises(ValueError, match="already written"):
        store.append(_row("a"))
    again = ResultStore(tmp_path).load()
    assert again[("a", 0)]["correct"] is True


@pytest.mark.parametrize(
    "content,message",
    [
        (b'{"quotas": [32, 128', "not valid JSON (expected a JSON quota schedule; Expecting"),
        (b"not json", "line 1 column 1"),
        (b"\xff\xfe", "not a UTF-8 text file"),
        (b"[32, 128, 32]", "expected a JSON object (quota schedule), got a list"),
    ],
)
def test_a_torn_or_wrong_json_file_is_refused_naming_it(tmp_path, content, message):
    p = tmp_path / "schedule.json"
    p.write_bytes(content)
    with pytest.raises(BadRowError, match=re.escape(message)) as exc:
        load_schedule(p)
    assert str(p) in str(exc.value)
    p.write_text('{"quotas": [32, 128, 32]}')
    assert load_schedule(p) == [32, 128, 32] and read_json_object(p) == {"quotas": [32, 128, 32]}


def test_compare_refuses_a_torn_run_config_naming_it(tmp_path, capsys):
    for arm in ("a", "b"):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "config.json").write_text('{"benchmark": {"name": ')
    assert compare_main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'a' / 'config.json'}: not valid JSON (expected a JSON run config" in err
    assert not (tmp_path / "cmp").exists()


def test_torn_json_inputs_of_the_analysis_scripts_are_named(tmp_path, monkeypatch):
    """Each was a JSONDecodeError (or KeyError) traceback: a PEFT adapter's config, a bench JSON given to
    ``analysis.log_bench`` (after the files before it had been logged), the miniature's ZoomR selection file, a JSON
    file given to ``analysis.slim_runs``; a torn ``testbed_table`` cache is computed again."""
    from types import SimpleNamespace

    from analysis import log_bench, miniature, slim_runs, testbed_table
    from zoomr.models import adapter_base

    torn = tmp_path / "torn.json"
    torn.write_text('{"results": ')
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text('{"base_model_name_or_path": ')
    with pytest.raises(BadRowError, match="adapter_config.json: not valid JSON \\(expected a JSON PEFT adapter config"):
        adapter_base(tmp_path / "adapter")
    good = tmp_path / "good.json"
    good.write_text('{"results": {"step_ms": 3.0}}')
    logged = []
    monkeypatch.setattr(log_bench, "log_summary_run", lambda **kw: logged.append(kw) or {})
    with pytest.raises(BadRowError, match="torn.json: not valid JSON \\(expected a JSON bench JSON"):
        log_bench.main([str(good), str(torn), "--mode", "disabled"])
    assert not logged  # nothing logged before the torn file was found
    selection = tmp_path / "out" / miniature.SELECTION_DIR / "results.json"
    selection.parent.mkdir(parents=True)
    selection.write_text('{"results": ')
    with pytest.raises(BadRowError, match="not valid JSON"):
        miniature.selection(SimpleNamespace(out=str(tmp_path / "out")))
    selection.write_text('{"results": {"other": {}}}')
    with pytest.raises(BadRowError, match="no zoomr_writes selection"):
        miniature.selection(SimpleNamespace(out=str(tmp_path / "out")))
    with pytest.raises(BadRowError, match="torn.json: not valid JSON"):
        slim_runs.main([str(torn), "--out", str(tmp_path / "slim")])
    calls = []
    result = testbed_table.cached(torn, {"k": 1}, lambda run_dir: calls.append(run_dir) or {"acc": 1.0})
    assert calls and result["acc"] == 1.0 and json.loads(torn.read_text())["key"] == {"k": 1}


def test_a_malformed_longbench_row_or_arm_result_row_is_named(tmp_path):
    """A local LongBench file with a torn line and a miniature arm whose results.jsonl was cut mid-row were
    JSONDecodeError tracebacks."""
    from eval.arms import load_arm
    from eval.longbench import load_rows

    (tmp_path / "hotpotqa.jsonl").write_text('{"input": "q", "context": "c", "answers": ["a"]}\n{"input": \n')
    with pytest.raises(BadRowError, match=r"hotpotqa.jsonl line 2: bad_json"):
        load_rows("hotpotqa", str(tmp_path))
    arm = tmp_path / "arm"
    arm.mkdir()
    (arm / "metrics.json").write_text(json.dumps({"pooled": {}}))
    row = _row("testbed-5-0", correct=True, kv={"rows_mean": 10.0})
    (arm / "results.jsonl").write_text(json.dumps(row) + '\n{"problem_id": "testbed-5-1", "sam')
    with pytest.raises(BadRowError, match=r"results.jsonl line 2"):
        load_arm(arm)
    (arm / "results.jsonl").write_text(json.dumps(row) + "\n")
    assert load_arm(arm).ids == ["testbed-5-0"]
    (arm / "metrics.json").write_text('{"by_competition": {}}')  # a KeyError where the miniature reads it
    with pytest.raises(BadRowError, match=r"metrics.json: no pooled metrics"):
        load_arm(arm)
    (arm / "metrics.json").write_text('{"pooled": {}}')
    (arm / "results.jsonl").write_text(json.dumps(_row("testbed-5-0", kv={})) + "\n")
    with pytest.raises(BadRowError, match=r"results.jsonl line 1: an eval row without kv.rows_mean"):
        load_arm(arm)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"run_name": "sft", "model": {"name": "tiny"}, "method": {"name": "sft"}}, "(no 'benchmark' field)"),
        ({"benchmark": {"name": "x", "task": "bogus"}, "generation": {"n_samples": 1}}, "unknown benchmark.task 'bogus'"),
        ({"benchmark": {"name": "aime25"}, "generation": None}, "not subscriptable"),
    ],
)
def test_compare_refuses_a_config_that_is_not_an_eval_runs(tmp_path, capsys, config, message):
    """A training run's or a checkpoint's directory given to eval.compare was a KeyError traceback."""
    from tests.test_eval_runner import _fake_run

    _fake_run(tmp_path / "a", "full", 0.5)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps(config))
    assert compare_main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'b' / 'config.json'}: not an evaluation run's config" in err and message in err
    assert "Traceback" not in err and not (tmp_path / "cmp").exists()


def test_an_empty_benchmark_file_is_refused_not_left_out(tmp_path):
    """A suite whose HMMT file was empty (a truncated copy) evaluated the other competitions without a word."""
    from eval.benchmarks import SOURCES, load_problems

    aime, hmmt = (tmp_path / SOURCES[name].path for name in ("aime_2025", "hmmt_feb_2025"))
    for path, text in ((aime, '{"problem_idx": 1, "problem": "P", "answer": 70}\n'), (hmmt, "\n")):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    with pytest.raises(BadRowError, match=r"benchmark source 'hmmt_feb_2025': .*train\.jsonl holds no problems"):
        load_problems(["aime_2025", "hmmt_feb_2025"], tmp_path)
    assert [p.id for p in load_problems(["aime_2025"], tmp_path)] == ["aime_2025/I-01"]


@pytest.mark.parametrize(
    "source, bad, message",
    [
        ("aime_2025", {"problem_idx": 1.7}, "problem_idx is 1.7, not a problem number"),  # was AIME I-01
        ("aime_2025", {"problem_idx": 0}, "problem_idx is 0, not a problem number"),  # was AIME I-15
        ("hmmt_feb_2025", {"problem_idx": True}, "problem_idx is true, not a problem number"),  # was problem 01
        ("aime_2025", {"problem_idx": 31}, "problem_idx is 31, past the 30 problems of aime_2025"),  # was II-01
        ("cmimc_2025", {"problem_idx": "41"}, "problem_idx is 41, past the 40 problems of cmimc_2025"),
        ("aime_2025", {"answer": float("nan")}, "the answer is NaN, not a gold answer"),  # was the gold "nan"
        ("math500", {"unique_id": None}, "unique_id is null, not an id"),  # was the id math500/None
        ("math500", {"unique_id": " "}, 'unique_id is " ", not an id'),
    ],
)
def test_benchmark_row_with_an_unusable_id_or_gold_refuses_the_file(tmp_path, source, bad, message):
    from eval.benchmarks import SOURCES

    good = {"problem_idx": 2, "unique_id": "a", "problem": "P", "answer": 3}
    path = tmp_path / SOURCES[source].path
    path.parent.mkdir(parents=True)
    _write(path, [json.dumps(good).encode(), json.dumps({**good, **bad}).encode()])
    with pytest.raises(BadRowError, match=r"\.jsonl line 2: " + re.escape(message)):
        load_source(source, tmp_path)


@pytest.mark.parametrize(
    "source, url, message",
    [
        ("aime_2024", "2024_AIME_I_Problems/Problem_16", "AIME url names problem 16, not one of 1-15"),  # was I-16
        ("aime_2022_2024", "2023_AIME_II_Problems/Problem_0", "AIME url names problem 0, not one of 1-15"),
        ("amc23", "2023_AMC_12A_Problems/Problem_26", "AMC url names problem 26, not one of 1-25"),  # was 12A-26
    ],
)
def test_an_aops_url_past_the_papers_problems_refuses_the_file(tmp_path, source, url, message):
    from eval.benchmarks import SOURCES

    wiki = "https://artofproblemsolving.com/wiki/index.php/"
    good = {"problem": "P", "question": "P", "answer": 3, "url": wiki + url.rsplit("_", 1)[0] + "_1"}
    path = tmp_path / SOURCES[source].path
    path.parent.mkdir(parents=True)
    _write(path, [json.dumps(good).encode(), json.dumps({**good, "url": wiki + url}).encode()])
    with pytest.raises(BadRowError, match=r"\.jsonl line 2: " + re.escape(message)):
        load_source(source, tmp_path)


def test_a_problem_repeated_in_one_benchmark_file_is_named_as_such(tmp_path):
    """Was "problem math500/a appears in sources 'math500' and 'math500': a benchmark must not list overlapping sources"."""
    from eval.benchmarks import load_problems

    row = json.dumps({"problem": "P", "unique_id": "a", "answer": "1"}).encode()
    data = _math500_dir(tmp_path, [row, row])
    with pytest.raises(BadRowError, match=r"problem math500/a appears twice in .*math500/test\.jsonl \(benchmark source"):
        load_problems(["math500"], data)
