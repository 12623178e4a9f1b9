"""``eval.compare`` diffs the arms' fingerprints: arms run with different settings (48 vs 160 new tokens) are
refused with the differing fields named, or compared with ``--allow-different-settings`` and a warning."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eval.compare import CompareError, compare, load_run, main
from tests.test_eval_runner import _fake_run


def _fingerprint(run_dir: Path, method: str, max_new_tokens: int, model: str = "tiny") -> Path:
    fp = {"model": {"name": model}, "method": {"name": method},
          "benchmark": {"name": "aime25", "sources": ["aime_2025"]},
          "generation": {"temperature": 0.6, "max_new_tokens": max_new_tokens, "seed": 1234},
          "grading": {"math_verify": True, "strip_reasoning": False}}  # fmt: skip
    (run_dir / "fingerprint.json").write_text(json.dumps(fp))
    return run_dir


def test_different_settings_are_refused_and_named(tmp_path, capsys):
    _fingerprint(_fake_run(tmp_path / "a", "full", 0.6, seed=1), None, 48)
    _fingerprint(_fake_run(tmp_path / "b", "h2o", 0.4, seed=2), "h2o", 160, model="other")
    runs = [load_run(tmp_path / "a"), load_run(tmp_path / "b")]
    with pytest.raises(CompareError, match=r"generation.max_new_tokens: was 48, now 160"):
        compare(runs)
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")]) == 2
    assert "--allow-different-settings" in capsys.readouterr().err and not (tmp_path / "cmp").exists()
    result = compare(runs, allow_different_settings=True)
    assert result["setting_differences"] == [
        "tiny/h2o vs tiny/full (aime25): generation.max_new_tokens: was 48, now 160"
    ]
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp"),
                 "--allow-different-settings"]) == 0  # fmt: skip
    assert "WARNING: arms ran with different settings" in (tmp_path / "cmp" / "table.md").read_text()


def test_model_and_method_may_differ(tmp_path):
    """A trained checkpoint against the base model's full KV is the point of a comparison, not a mismatch."""
    _fingerprint(_fake_run(tmp_path / "a", "full", 0.6, seed=1), None, 48)
    _fingerprint(_fake_run(tmp_path / "b", "abridge", 0.4, seed=2), "abridge", 48, model="abridge-ckpt")
    result = compare([load_run(tmp_path / "a"), load_run(tmp_path / "b")])
    assert result["setting_differences"] == [] and "delta" in result["arms"]["tiny/abridge"]["aime25"]


def test_options_a_method_sets_do_not_make_arms_incomparable():
    """LightThinker's testbed arm leaves a thought end to the model (``thought_splitter``): same problems, so it
    stays comparable with full KV; a different trace length is still a different benchmark."""
    from eval.compare import comparable_settings
    from eval.testbed_task import TESTBED

    def fp(**options):
        return {"model": {"name": "m"}, "method": {"name": "x"}, "generation": {"max_new_tokens": 1088},
                "benchmark": {"name": "testbed", "options": {"trace_tokens": 1024, **options}}}  # fmt: skip

    full, lt = (
        comparable_settings(fp(), TESTBED.arm_options),
        comparable_settings(fp(thought_splitter=True), TESTBED.arm_options),
    )
    assert full == lt and "model" not in full and "method" not in full
    assert comparable_settings(fp(thought_splitter=True)) != comparable_settings(
        fp()
    )  # no arm options: compared
    assert comparable_settings(fp(trace_tokens=2048), TESTBED.arm_options) != full


def test_an_option_a_run_does_not_record_takes_its_default():
    """A run made before ``paragraph_topics`` existed ran with its default (False): comparable with a newer run that
    records False, not with one that records True."""
    from eval.compare import comparable_settings
    from eval.testbed_task import TESTBED

    def settings(**options):
        fp = {"model": {"name": "m"}, "generation": {"max_new_tokens": 1088},
              "benchmark": {"name": "testbed", "options": {"trace_tokens": 1024, **options}}}  # fmt: skip
        return comparable_settings(fp, TESTBED.arm_options, TESTBED.option_defaults())

    older = settings()
    assert older == settings(paragraph_topics=False)
    assert older != settings(paragraph_topics=True)
    assert comparable_settings(
        {"benchmark": {"name": "testbed", "options": {"trace_tokens": 1024}}}
    ) != comparable_settings({"benchmark": {"name": "testbed", "options": {"paragraph_topics": False, "trace_tokens": 1024}}})


@pytest.mark.parametrize("flag,value", [("--n-resamples", "0"), ("--confidence", "1.5"), ("--confidence", "0"),
                                        ("--seed", "-1")])  # --seed -1 was numpy's ValueError traceback
def test_impossible_bootstrap_settings_are_refused_before_reading_runs(tmp_path, capsys, flag, value):
    # the run directories do not exist: the setting is named first, and nothing is written
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp"), flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} {value}" in err and "does not exist" not in err and not (tmp_path / "cmp").exists()


def test_an_index_matrix_larger_than_free_memory_is_refused_by_its_size(monkeypatch):
    """``--n-resamples 100000000`` on 64 problems was numpy's MemoryError traceback for 47.7 GiB after every run had
    been read (or, where the allocation succeeds, a machine swapping until the kernel kills the process)."""
    from eval import bootstrap
    from zoomr.schemas.checks import SettingsError

    assert bootstrap.free_memory_bytes() > 0  # Linux says
    monkeypatch.setattr(bootstrap, "free_memory_bytes", lambda: 2**30)
    with pytest.raises(SettingsError, match=r"n_resamples=2000000 resamples of 100 problems need 1.5 GiB of indices, "
                                            r"more than the 1.0 GiB free"):  # fmt: skip
        bootstrap.index_matrix(100, 2_000_000)
    assert bootstrap.index_matrix(100, 2000).shape == (2000, 100)
    monkeypatch.setattr(bootstrap, "free_memory_bytes", lambda: None)  # a system that does not say: no check
    assert bootstrap.index_matrix(3, 10).shape == (10, 3)


def test_an_older_fingerprint_without_the_length_takes_its_configs(tmp_path):
    """benchmark.length entered the fingerprint on 2026-12-06: an older run is compared at its config.json's length,
    so it stays comparable with a newer run at the same length (and not with one at another)."""
    a = _fingerprint(_fake_run(tmp_path / "a", "full", 0.6, seed=1), None, 48)  # no length in its fingerprint
    config = json.loads((a / "config.json").read_text())
    config["benchmark"]["length"] = 256
    (a / "config.json").write_text(json.dumps(config))
    b = _fingerprint(_fake_run(tmp_path / "b", "h2o", 0.4, seed=2), "h2o", 48)
    fp = json.loads((b / "fingerprint.json").read_text())
    for length, differences in ((256, []), (512, ["tiny/h2o vs tiny/full (aime25): benchmark.length: was 256, now 512"])):
        fp["benchmark"]["length"] = length
        (b / "fingerprint.json").write_text(json.dumps(fp))
        result = compare([load_run(a), load_run(b)], allow_different_settings=True)
        assert result["setting_differences"] == differences


def _ruler_run(run_dir: Path, scope: object, ids: list[str] = ()) -> Path:
    """A RULER run directory as ``python -m eval benchmark=ruler`` leaves it: ``problems.json`` lists ``scope``, and
    ``results.jsonl`` holds one correct sample of each of ``ids``."""
    from eval.results import ResultStore
    from eval.tasks import SCOPE_FILE

    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"run_name": run_dir.name, "model": {"name": "tiny"},
        "benchmark": {"name": "ruler_1024", "task": "ruler", "sources": [], "length": 1024},
        "generation": {"n_samples": 1}}))  # fmt: skip
    (run_dir / SCOPE_FILE).write_text(json.dumps(scope))
    (run_dir / "results.jsonl").touch()
    store = ResultStore(run_dir, fsync=False)
    for pid in ids:
        store.append({"problem_id": pid, "sample": 0, "competition": "niah_single_1", "correct": True,
                      "truncated": False, "n_tokens": 5, "kv": {}, "score": 1.0})  # fmt: skip
    return run_dir


@pytest.mark.parametrize(
    "scope,message",
    [
        ([], "lists no problems"),  # a KeyError traceback in eval.compare, a ValueError one ending paper_tables
        (["a", "b", "a"], r"lists problems more than once \(\['a'\]\)"),  # a's sample counted twice, without a word
        ({"a": 0, "b": 1}, "not a list of problem ids"),  # its keys read as the problems
    ],
)
def test_a_scope_with_no_or_repeated_problems_is_refused_naming_the_file(tmp_path, capsys, scope, message):
    from analysis.paper_tables.inputs import discover

    ok = _ruler_run(tmp_path / "ok", ["a", "b"], ["a", "b"])
    bad = _ruler_run(tmp_path / "bad", scope, ["a", "b"])
    assert main([str(ok), str(bad), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert f"{bad / 'problems.json'}: " in err and re.search(message, err) and not (tmp_path / "cmp").exists()
    inputs = discover([str(ok), str(bad)])  # paper_tables: an unusable input, named; the other run is still read
    assert [a.run.path for a in inputs.evals] == [ok] and re.search(message, inputs.problems[0])


def test_the_same_run_directory_given_twice_is_refused(tmp_path, capsys):
    """Under two ``--labels`` one run was compared with itself: a Δ of +0.0 [+0.0, +0.0], without a word."""
    run = _fake_run(tmp_path / "a", "full", 0.6, seed=1)
    (tmp_path / "link").symlink_to(run)
    for argv in (["--labels", "x", "y"], []):
        assert main([str(run), str(tmp_path / "link"), *argv, "--out", str(tmp_path / "cmp")]) == 2
        assert f"{tmp_path / 'link'} is given twice" in capsys.readouterr().err and not (tmp_path / "cmp").exists()


def test_a_comparison_cut_short_while_writing_leaves_the_old_tables_whole(tmp_path, monkeypatch):
    """``table.csv`` was opened (emptied) before its rows were written and ``table.md`` rewritten before it: a kill
    there left an empty csv beside a new md and the old json. Each file is renamed into place whole now."""
    import csv

    a, b = _fake_run(tmp_path / "a", "full", 0.6, seed=1), _fake_run(tmp_path / "b", "h2o", 0.4, seed=2)
    out = tmp_path / "cmp"
    assert main([str(a), str(b), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # stands in for a kill while the rows are written

    monkeypatch.setattr(csv, "writer", killed)
    with pytest.raises(KeyboardInterrupt):
        main([str(a), str(b), "--labels", "ref", "arm", "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no torn file, no temporary one left


def test_arms_on_a_benchmark_the_reference_did_not_run_are_still_compared_for_settings(tmp_path):
    """Two arms on a benchmark without the reference arm were tabulated side by side at 48 and 160 new tokens
    without a word (their settings were only diffed against the reference's)."""
    full = _fingerprint(_fake_run(tmp_path / "full", "full", 0.6, seed=1), None, 48)
    arms = [_fingerprint(_fake_run(tmp_path / m, m, 0.4, seed=2), m, cap) for m, cap in (("h2o", 48), ("snap", 160))]
    for run in arms:
        config = json.loads((run / "config.json").read_text())
        config["benchmark"]["name"] = "aime25_again"
        (run / "config.json").write_text(json.dumps(config))
    runs = [load_run(p) for p in (full, *arms)]
    with pytest.raises(CompareError, match=r"tiny/snap vs tiny/h2o \(aime25_again\): generation.max_new_tokens: was 48, now 160"):
        compare(runs)
    assert compare(runs, allow_different_settings=True)["setting_differences"] == [
        "tiny/snap vs tiny/h2o (aime25_again): generation.max_new_tokens: was 48, now 160"
    ]


def test_a_run_whose_grading_failed_is_refused_not_counted_as_wrong(tmp_path, capsys):
    """A run that ended with "grading failed for N samples ... a rerun grades those samples again" was compared as
    complete, its ungraded samples counted as incorrect. Past grading.max_error_rate it is refused, naming the run."""
    from eval.results import RESULTS_FILE

    ref, arm = _fake_run(tmp_path / "a", "full", 0.6, seed=1), _fake_run(tmp_path / "b", "h2o", 0.6, seed=2)
    lines = (arm / RESULTS_FILE).read_text().splitlines()
    failed = [json.dumps({**json.loads(line), "correct": False, "grade_method": "error"}) for line in lines[:2]]
    (arm / RESULTS_FILE).write_text("\n".join(failed + lines[2:]) + "\n")
    assert main([str(ref), str(arm), "--out", str(tmp_path / "cmp")]) == 2
    assert f"{arm}: grading failed for 2 of 12 samples (first ('aime_2025/I-01', 0)), more than " \
           "grading.max_error_rate=0.01" in capsys.readouterr().err and not (tmp_path / "cmp").exists()  # fmt: skip
    config = json.loads((arm / "config.json").read_text())
    (arm / "config.json").write_text(json.dumps({**config, "grading": {"max_error_rate": 0.2}}))
    assert load_run(arm).rows[0]["grade_method"] == "error"  # within the run's own rate: as the run counted them


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"source": "hub"}, "could not load MathArena/aime_2025 from the Hugging Face hub"),  # was a traceback
        ({"data_dir": "no/such/dir"}, "aime_2025/train.jsonl not found"),  # named no run
    ],
)
def test_a_run_whose_problems_cannot_be_listed_here_is_named(tmp_path, capsys, monkeypatch, edit, message):
    def offline(source):  # eval.benchmarks._hub_rows without importing datasets
        raise RuntimeError(f"could not load {source.hub_id} from the Hugging Face hub (offline)")

    monkeypatch.setattr("eval.benchmarks._hub_rows", offline)
    run = _fake_run(tmp_path / "a", "full", 0.6)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "benchmark": {**config["benchmark"], **edit}}))
    assert main([str(run), str(_fake_run(tmp_path / "b", "h2o", 0.6)), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err
    assert f"{run}: the problems of its benchmark 'aime25' cannot be listed here" in err and message in err


def test_the_confidence_level_is_shown_as_given(tmp_path):
    """``--confidence 0.975`` headed its column ``97% CI`` (``int(100 * 0.975)``; 0.58 showed 57%): the interval
    was the 97.5% one under another level's name."""
    from eval.compare import confidence_label

    a, b = _fake_run(tmp_path / "a", "full", 0.6, seed=1), _fake_run(tmp_path / "b", "h2o", 0.4, seed=2)
    out = tmp_path / "cmp"
    assert main([str(a), str(b), "--confidence", "0.975", "--out", str(out)]) == 0
    assert "[97.5% CI]" in (out / "table.md").read_text()
    assert [confidence_label(c) for c in (0.95, 0.9, 0.58, 0.999)] == ["95%", "90%", "58%", "99.9%"]


def _scored_run(run_dir: Path, run_name: str, scores: list[float]) -> Path:
    """A RULER run directory as ``python -m eval benchmark=ruler`` leaves it: its scope and one row per problem."""
    run_dir.mkdir(parents=True)
    config = {"run_name": run_name, "model": {"name": "tiny"}, "generation": {"n_samples": 1},
              "benchmark": {"name": "ruler_1024", "task": "ruler", "sources": [], "length": 1024}}  # fmt: skip
    (run_dir / "config.json").write_text(json.dumps(config))
    ids = [f"niah_single_1-{i}" for i in range(len(scores))]
    (run_dir / "problems.json").write_text(json.dumps(ids))
    rows = [{"problem_id": pid, "sample": 0, "competition": "niah_single_1", "correct": s >= 1.0, "score": s,
             "truncated": False, "n_tokens": 5, "kv": {}, "grade_method": "ruler"} for pid, s in zip(ids, scores)]  # fmt: skip
    (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_a_scored_benchmarks_avg_at_k_says_it_counts_full_scores(tmp_path):
    """RULER / LongBench rows are correct only at a full score (score 1): the table's "avg@k" and Δ were that share
    (LongBench's F1 arms all near 0%) under the math benchmarks' name, beside no word that the benchmark's own
    score is the mean. The column and the note now say so; a math comparison's table is unchanged."""
    full = _scored_run(tmp_path / "full", "full", [1.0, 0.5, 1.0, 0.5])
    snap = _scored_run(tmp_path / "snap", "snap", [1.0, 0.5, 0.5, 0.0])
    out = tmp_path / "cmp"
    assert main([str(full), str(snap), "--out", str(out)]) == 0
    md = (out / "table.md").read_text()
    assert "| ruler_1024 avg@k (score 1) |" in md and "| 50.0 (avg@1) |" in md and "| 25.0 (avg@1) |" in md
    assert "On ruler_1024 (scored per sample in [0, 1]) avg@k and Δ count the samples with a full score" in md
    assert json.loads((out / "table.json").read_text())["full_score_benchmarks"] == ["ruler_1024"]
    a, b = _fake_run(tmp_path / "a", "full", 0.6, seed=1), _fake_run(tmp_path / "b", "h2o", 0.4, seed=2)
    result = compare([load_run(a), load_run(b)])
    assert "full_score_benchmarks" not in result


def test_a_one_problem_comparison_shows_its_difference_and_why_no_interval(tmp_path):
    """Arms on one problem (problem_limit=1): the Δ cell was "—" with no word, as if the arm had not run; now the
    difference of the problem's avg@k and "no interval" (a bootstrap over one problem has none)."""
    from eval.metrics import per_problem_accuracy

    a, b = _fake_run(tmp_path / "a", "full", 0.6, limit=1, seed=1), _fake_run(tmp_path / "b", "h2o", 0.9, limit=1, seed=5)
    ref, arm = load_run(a), load_run(b)
    result = compare([ref, arm])
    pid = ref.rows[0]["problem_id"]
    delta = per_problem_accuracy(arm.rows)[pid] - per_problem_accuracy(ref.rows)[pid]
    assert result["arms"]["tiny/h2o"]["aime25"]["delta"] == {"delta": delta, "low": None, "high": None, "n_problems": 1}
    out = tmp_path / "cmp"
    assert main([str(a), str(b), "--out", str(out)]) == 0
    assert f"| {100 * delta:+.1f} [one problem: no interval] |" in (out / "table.md").read_text()
