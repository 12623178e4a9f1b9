"""The evaluation loop with a stand-in generator: one row per key, resume after an interruption or a
torn line, settings guard, and the comparison table (layout, paired Δ, mismatched problems)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from eval.benchmarks import Problem, load_source
from eval.bootstrap import paired_bootstrap
from eval.compare import CompareError, compare, load_run, main, table_rows
from eval.generation import Generation
from eval.grading import Grader
from eval.metrics import compute_metrics, per_problem_accuracy
from eval.results import RESULTS_FILE, ResultStore, check_fingerprint
from eval.runner import evaluate

PROBLEMS = [
    Problem(id=f"t/{i:02d}", question=f"Q{i}", answer=str(i), competition=f"c{i % 2}") for i in range(6)
]


def fake_generate(prompts: list[str], seeds: list[int]) -> list[Generation]:
    """Deterministic per (prompt, seed): right for about half of the samples."""
    out = []
    for prompt, seed in zip(prompts, seeds):
        i = int(prompt[1:])
        answer = i if seed % 2 else i + 1
        ids = list(range(3 + seed % 5))
        out.append(Generation(f"so \\boxed{{{answer}}}", ids, truncated=len(ids) == 7, prompt_tokens=4,
                              kv={"rows_mean": 5.0 + seed % 3, "rows_peak": 9.0}))  # fmt: skip
    return out


def _evaluate(run_dir, generate=fake_generate, **kw):
    kw = {"progress": False, **kw}
    with Grader(workers=1, math_verify=False) as grader:
        return evaluate(PROBLEMS, generate, grader, ResultStore(run_dir), lambda p: p.question,
                        benchmark="toy", n_samples=3, batch_size=4, seed=1234, **kw)  # fmt: skip


def _strip_times(rows):
    return [{k: v for k, v in r.items() if k not in ("wall_seconds", "grade_seconds")} for r in rows]


def test_rows_have_every_field(tmp_path):
    rows = _evaluate(tmp_path)
    assert len(rows) == 18 and len({(r["problem_id"], r["sample"]) for r in rows}) == 18
    for key in ("benchmark", "problem_id", "sample", "text", "n_tokens", "truncated", "extracted", "correct",
                "kv", "wall_seconds", "competition", "gold", "grade_method", "prompt_tokens"):  # fmt: skip
        assert key in rows[0]
    lines = (tmp_path / RESULTS_FILE).read_text().splitlines()
    assert len(lines) == 18
    m = compute_metrics(rows)
    assert set(m["by_competition"]) == {"c0", "c1"}
    assert 0 < m["pooled"]["accuracy"] < 1


def test_each_problem_s_prompt_is_rendered_once_for_all_its_samples(tmp_path):
    """The samples of a problem (3, across batches of 4) share one rendering; the runner rendered it once per sample
    and kept every problem's prompt until the run ended."""
    rendered = []

    def render(p):
        rendered.append(p.id)
        return p.question

    with Grader(workers=1, math_verify=False) as grader:
        rows = evaluate(PROBLEMS, fake_generate, grader, ResultStore(tmp_path), render, benchmark="toy", n_samples=3,
                        batch_size=4, seed=1234, progress=False)  # fmt: skip
    assert rendered == [p.id for p in PROBLEMS]
    assert _strip_times(rows) == _strip_times(_evaluate(tmp_path / "again"))


def test_the_progress_bar_names_the_run_it_belongs_to(tmp_path, capsys):
    """An analysis running several arms (testbed_table, zoomr_testbed) showed 'eval testbed' for each of them."""
    _evaluate(tmp_path / "h2o-50", progress=True)
    assert "eval toy [h2o-50]: 100%" in capsys.readouterr().err


def test_interrupted_run_resumes_to_identical_rows(tmp_path):
    full = _strip_times(_evaluate(tmp_path / "full"))
    calls = 0

    def dying(prompts, seeds):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise KeyboardInterrupt  # the run dies in its third batch
        return fake_generate(prompts, seeds)

    with pytest.raises(KeyboardInterrupt):
        _evaluate(tmp_path / "cut", dying)
    path = tmp_path / "cut" / RESULTS_FILE
    assert len(path.read_text().splitlines()) == 8
    with open(path, "a") as f:  # a write torn by a kill
        f.write('{"problem_id": "t/05", "sam')
    store = ResultStore(tmp_path / "cut")
    assert len(store.load()) == 8 and store.torn == 1
    resumed = _strip_times(_evaluate(tmp_path / "cut"))
    assert resumed == full
    lines = path.read_text().splitlines()
    assert len(lines) == 18 and all(json.loads(line) for line in lines)
    assert compute_metrics(resumed) == compute_metrics(full)


def test_settings_guard(tmp_path):
    check_fingerprint(tmp_path, {"generation": {"temperature": 0.6}})
    check_fingerprint(tmp_path, {"generation": {"temperature": 0.6}})
    with pytest.raises(SystemExit, match="generation.temperature: was 0.6, now 0.0"):
        check_fingerprint(tmp_path, {"generation": {"temperature": 0.0}})


def test_settings_guard_compares_the_benchmark_length(tmp_path):
    """RULER's benchmark.length sizes every prompt but its problem ids do not show it: a rerun at another length into
    the same directory (benchmark.name given, or an arm's own run_dir) resumed the other length's rows as its own."""
    from hydra import compose, initialize_config_dir

    from eval.__main__ import fingerprint
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra

    register_with_hydra()

    def fp(length: int) -> dict:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return fingerprint(compose("eval", overrides=["benchmark=ruler", "benchmark.name=ruler",
                                                          f"benchmark.length={length}"]))  # fmt: skip

    check_fingerprint(tmp_path, fp(256))
    with pytest.raises(SystemExit, match="benchmark.length: was 256, now 512"):
        check_fingerprint(tmp_path, fp(512))
    # a fingerprint written before the length was in it: resumed as before, and the length recorded from now on
    old = {**fp(256), "benchmark": {k: v for k, v in fp(256)["benchmark"].items() if k != "length"}}
    (tmp_path / "fingerprint.json").write_text(json.dumps(old))
    check_fingerprint(tmp_path, fp(512))
    assert json.loads((tmp_path / "fingerprint.json").read_text())["benchmark"]["length"] == 512


def test_settings_guard_accepts_a_setting_added_at_its_null_default(tmp_path):
    """A run made before a new method field existed resumes when the field is at its default (None);
    the same field set to a value is a real difference and is refused."""
    check_fingerprint(tmp_path, {"method": {"budget_rows": 64}})
    check_fingerprint(tmp_path, {"method": {"budget_rows": 64, "budget_fraction": None}})
    with pytest.raises(SystemExit, match="method.budget_match: was None, now 'runs/x'"):
        check_fingerprint(tmp_path, {"method": {"budget_rows": 64, "budget_fraction": None, "budget_match": "runs/x"}})


def _fake_run(run_dir, run_name, correct_rate, limit=6, samples=2, seed=0):
    """A run directory as `python -m eval` leaves it, on the first `limit` AIME 2025 problems."""
    run_dir.mkdir(parents=True)
    config = {
        "run_name": run_name,
        "model": {"name": "tiny"},
        "benchmark": {"name": "aime25", "sources": ["aime_2025"], "problem_limit": limit},
        "generation": {"n_samples": samples},
    }
    (run_dir / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    store = ResultStore(run_dir, fsync=False)
    for p in load_source("aime_2025", "eval/data/benchmarks")[:limit]:
        for s in range(samples):
            n = int(rng.integers(10, 100))
            store.append({"problem_id": p.id, "sample": s, "competition": p.competition,
                          "correct": bool(rng.random() < correct_rate), "truncated": n > 90, "n_tokens": n,
                          "kv": {"kv_per_512": 512.0 * correct_rate}, "grade_method": "exact"})  # fmt: skip
    return run_dir


def test_compare_table(tmp_path, capsys):
    ref = load_run(_fake_run(tmp_path / "a", "full", 0.6, seed=1))
    arm = load_run(_fake_run(tmp_path / "b", "abridge", 0.4, seed=2))
    result = compare([ref, arm], n_resamples=2000, seed=1234)
    d = result["arms"]["tiny/abridge"]["aime25"]["delta"]
    ids = [r["problem_id"] for r in ref.rows[::2]]
    a, b = per_problem_accuracy(arm.rows), per_problem_accuracy(ref.rows)
    ci = paired_bootstrap(np.array([a[i] for i in ids]), np.array([b[i] for i in ids]), seed=1234)
    assert (d["delta"], d["low"], d["high"]) == (ci.delta, ci.low, ci.high)
    header, rows = table_rows(result)
    assert header[:4] == ["Arm", "KV/512", "Mean KV (MiB)", "aime25 avg@k"] and header[-2].startswith(
        "Trunc."
    )
    assert rows[0][0] == "tiny/full" and rows[0][4] == "ref" and rows[0][1] == "307" and rows[0][2] == "—"
    assert re.fullmatch(r"[+-]\d+\.\d \[[+-]\d+\.\d, [+-]\d+\.\d\]", rows[1][4])
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")]) == 0
    assert {p.name for p in (tmp_path / "cmp").iterdir()} == {"table.md", "table.csv", "table.json"}
    assert "tiny/abridge" in capsys.readouterr().out


def test_compare_refuses_different_problems(tmp_path, capsys):
    _fake_run(tmp_path / "a", "full", 0.5)
    _fake_run(tmp_path / "b", "other", 0.5, limit=4)
    with pytest.raises(CompareError, match="cover different problems"):
        compare([load_run(tmp_path / "a"), load_run(tmp_path / "b")])
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")]) == 2
    assert "only in the first: ['aime_2025/I-05', 'aime_2025/I-06']" in capsys.readouterr().err


def test_compare_refuses_incomplete_runs(tmp_path):
    run = _fake_run(tmp_path / "a", "full", 0.5)
    lines = (run / RESULTS_FILE).read_text().splitlines()
    (run / RESULTS_FILE).write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(CompareError, match="incomplete run, 11 of 12"):
        load_run(run)


def test_a_full_disk_while_a_row_is_appended_names_the_file_and_keeps_the_rows_before(tmp_path, monkeypatch):
    """ENOSPC while appending a result row: ``OSError: [Errno 28] No space left on device`` without a path, as a
    traceback, with part of the row left in the file. Now the message names the file and the rows before are kept
    as they were (the partial row taken back), for the same command to resume from."""
    import errno
    import os

    from eval.results import ResultStore
    from zoomr.paths import OutputUnwritable

    store = ResultStore(tmp_path)
    row = {"problem_id": "p0", "sample": 0, "competition": "c", "truncated": False, "correct": True}
    store.append(row)
    before = store.path.read_bytes()

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OutputUnwritable, match=f"{store.path}: a result row could not be appended \\(No space left"):
        store.append({**row, "sample": 1})
    assert store.path.read_bytes() == before and len(store.rows) == 1
