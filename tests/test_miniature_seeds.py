"""analysis.miniature_seeds: per-seed numbers equal the miniature table's; pooled = stratified over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis import miniature_seeds as seeds

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = REPO_ROOT / "analysis/results/miniature"


ROW = {"sample": 0, "competition": "testbed", "n_tokens": 1024, "truncated": False}  # a result row's other fields


def _fake_seed(root: Path, test_seed: int, arms: dict[str, list[int]], paired_with: str = "full") -> Path:
    """A miniature output with arms whose per-problem correctness is given (every other field fixed)."""
    out = root / f"s{test_seed}"
    entries = []
    for name, correct in arms.items():
        run = out / "arms" / name.replace("@", "_at_")
        run.mkdir(parents=True)
        rows = [{**ROW, "problem_id": f"testbed-{test_seed}-{i}", "correct": bool(c), "recall_accuracy": 1.0,
                 "kv": {"rows_mean": 100.0 if name == "full" else 40.0}} for i, c in enumerate(correct)]  # fmt: skip
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "metrics.json").write_text('{"pooled": {}}')
        entries.append({"name": name, "paired_with": paired_with, "rows_over_full": 1.0 if name == "full" else 0.4})
    (out / "results.json").write_text(json.dumps({"meta": {"test_seed": test_seed}, "arms": entries}))
    return out


def test_per_seed_numbers_equal_the_committed_miniature_table(tmp_path):
    """On the committed seed-2,000,003 arms the per-seed Δ and interval are the table's own (the same paired
    bootstrap), and one seed's pooled interval is that interval again."""
    (tmp_path / "results.json").symlink_to(COMMITTED / "results.json")
    (tmp_path / "arms").symlink_to(COMMITTED / "runs/arms")
    committed = {a["name"]: a for a in json.loads((COMMITTED / "results.json").read_text())["arms"]}
    arms = ["abridge", "abridge_uniform", "kvzap@-5.75", "zoomr", "lightthinker", "evict_random"]
    results = seeds.run([tmp_path], arms, ["abridge:abridge_uniform"])
    by_arm = {(c["arm"], c["vs"]): c for c in results["comparisons"]}
    for name in arms:
        c = by_arm[(name, "full KV")]
        (s,) = c["per_seed"]
        assert s["delta"] == committed[name]["delta_vs_full"] and s["ci"] == committed[name]["ci_vs_full"]
        assert s["accuracy"] == committed[name]["answer_accuracy"]
        assert c["pooled"]["ci"] == s["ci"] and c["pooled"]["n"] == 256
    vs = by_arm[("abridge", "abridge_uniform")]["per_seed"][0]
    assert vs["delta"] == pytest.approx(committed["abridge"]["answer_accuracy"] - committed["abridge_uniform"]["answer_accuracy"])


def test_pooled_over_seeds_weighs_every_problem_once(tmp_path):
    rng = np.random.default_rng(0)
    full_a, arm_a = rng.integers(0, 2, 40), rng.integers(0, 2, 40)
    full_b, arm_b = rng.integers(0, 2, 120), rng.integers(0, 2, 120)
    a = _fake_seed(tmp_path, 11, {"full": full_a, "abridge": arm_a, "abridge_uniform": full_a})
    b = _fake_seed(tmp_path, 12, {"full": full_b, "abridge": arm_b})
    results = seeds.run([a, b], None, ["abridge:abridge_uniform"])
    by_arm = {(c["arm"], c["vs"]): c for c in results["comparisons"]}
    per = by_arm[("abridge", "full KV")]
    assert [s["test_seed"] for s in per["per_seed"]] == [11, 12]
    expected = (np.sum(arm_a - full_a) + np.sum(arm_b - full_b)) / 160
    assert per["pooled"]["delta"] == pytest.approx(expected) and per["pooled"]["n"] == 160
    assert per["pooled"]["ci"][0] <= expected <= per["pooled"]["ci"][1]
    assert per["worst_delta"] == min(np.mean(arm_a - full_a), np.mean(arm_b - full_b))
    assert per["pooled"]["rows_over_full"] == pytest.approx(0.4)
    assert per["per_seed"][0]["correct"] == "".join(map(str, arm_a)) and per["per_seed"][1]["vs_correct"] == "".join(map(str, full_b))
    assert len(by_arm[("abridge_uniform", "full KV")]["per_seed"]) == 1  # an arm one seed lacks is pooled where it ran
    assert len(by_arm[("abridge", "abridge_uniform")]["per_seed"]) == 1
    assert results["meta"]["n_problems"] == 160 and results["meta"]["test_seeds"] == [11, 12]
    table = seeds.markdown(results)
    assert "| abridge | full KV | 2 |" in table and "| abridge | abridge_uniform | 1 |" in table


def test_bad_inputs_are_refused_by_name(tmp_path):
    a = _fake_seed(tmp_path / "x", 11, {"full": [1, 0, 1], "abridge_uniform": [1, 1, 1]})
    again = _fake_seed(tmp_path / "y", 11, {"full": [1, 1], "abridge_uniform": [0, 1]})
    with pytest.raises(SystemExit, match="test seed 11 twice"):
        seeds.run([a, again], None, [])
    short = _fake_seed(tmp_path / "z", 13, {"full": [1, 0, 1], "abridge_uniform": [1, 1]})
    with pytest.raises(SystemExit, match="abridge_uniform and full ran different problems"):
        seeds.run([short], None, [])
    with pytest.raises(SystemExit, match=r"\['zoomr'\] ran on none of the seeds"):
        seeds.run([a], ["abridge_uniform", "zoomr"], [])
    import shutil

    shutil.rmtree(a / "arms" / "full")
    with pytest.raises(SystemExit, match="lists full, but .* has no results.jsonl"):
        seeds.run([a], None, [])
    with pytest.raises(SystemExit):
        seeds.main([str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit):
        seeds.main([str(a), "--vs", "abridge_uniform"])


def test_outputs_at_different_trace_lengths_are_not_pooled(tmp_path):
    """A seed run with task.trace_tokens=2048 beside seeds at 1024 was pooled into one Δ and interval without a word
    (the meta records each length); refused naming every output's length before anything is written."""
    a = _fake_seed(tmp_path, 11, {"full": [1, 0, 1], "abridge": [1, 1, 0]})
    b = _fake_seed(tmp_path, 12, {"full": [1, 1], "abridge": [0, 1]})
    for out, length in ((a, 1024), (b, 2048)):
        results = json.loads((out / "results.json").read_text())
        (out / "results.json").write_text(json.dumps({**results, "meta": {"test_seed": results["meta"]["test_seed"],
                                                                         "trace_tokens": length}}))  # fmt: skip
    with pytest.raises(SystemExit, match=f"different trace lengths \\({a}: 1024, {b}: 2048\\)"):
        seeds.main([str(a), str(b), "--out", str(tmp_path / "pooled")])
    assert not (tmp_path / "pooled").exists()


def test_a_pair_forest_arm_or_results_file_that_cannot_be_used_is_named(tmp_path):
    """``--vs abridge_uniform:bogus`` and ``--forest bogus`` were dropped without a word (the table lacked the pair, the
    figure was empty), and a torn results.json or ``--committed`` file was a ``JSONDecodeError`` traceback."""
    from zoomr.jsonl import BadRowError

    a = _fake_seed(tmp_path, 11, {"full": [1, 0, 1], "abridge_uniform": [1, 1, 1]})
    with pytest.raises(SystemExit, match=r"--vs abridge_uniform:bogus: the two arms ran together on none of the seeds"):
        seeds.run([a], None, ["abridge_uniform:bogus"])
    assert seeds.run([a], None, None)["comparisons"]  # the default pairs: each where it ran, none here
    out = tmp_path / "report"
    with pytest.raises(SystemExit, match=r"--forest \['bogus'\]: not compared with full KV here"):
        seeds.main([str(a), "--forest", "bogus", "--out", str(out)])
    assert not out.exists()  # refused before anything is written
    with pytest.raises(BadRowError, match="not valid JSON"):
        seeds.run([a], None, None, committed=a / "arms" / "full" / "results.jsonl")
    (a / "results.json").write_text('{"meta": {"test_seed": 11}, "arms": [{"name": "full"}, 3]}')
    with pytest.raises(BadRowError, match="not a miniature results.json"):
        seeds.run([a], None, None)


def test_main_writes_the_table_results_and_forest(tmp_path):
    a = _fake_seed(tmp_path, 11, {"full": [1] * 20, "abridge": [1] * 18 + [0] * 2})
    b = _fake_seed(tmp_path, 12, {"full": [1] * 20, "abridge": [1] * 20})
    out = tmp_path / "report"
    seeds.main([str(a), str(b), "--out", str(out), "--forest", "abridge"])
    results = json.loads((out / "results.json").read_text())
    (c,) = [c for c in results["comparisons"] if c["arm"] == "abridge"]
    assert [s["delta"] for s in c["per_seed"]] == [-0.1, 0.0] and c["pooled"]["delta"] == pytest.approx(-0.05)
    assert (out / "table.md").read_text().startswith("Miniature across 2 test seeds")
    assert (out / "forest.png").stat().st_size > 5000


def test_an_arm_against_a_committed_arm_equals_the_direct_pairing(tmp_path):
    """--committed: an arm of an earlier run (its per-problem strings) pairs with a new arm exactly as if both
    had run here, where the full-KV runs agree problem by problem; otherwise it is refused."""
    rng = np.random.default_rng(1)
    full, old, new = (rng.integers(0, 2, 50) for _ in range(3))
    both = _fake_seed(tmp_path / "both", 21, {"full": full, "abridge": old, "abridge_c256_perlayer": new})
    direct = seeds.run([both], None, ["abridge_c256_perlayer:abridge"])
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(seeds.run([both], ["full", "abridge"], [])))
    later = _fake_seed(tmp_path / "later", 21, {"full": full, "abridge_c256_perlayer": new})
    via = seeds.run([later], None, ["abridge_c256_perlayer:committed/abridge"], committed=earlier)
    (d,) = [c for c in direct["comparisons"] if c["vs"] == "abridge"]
    (v,) = [c for c in via["comparisons"] if c["vs"] == "committed/abridge"]
    assert v["per_seed"][0]["delta"] == d["per_seed"][0]["delta"] == pytest.approx(np.mean(new - old))
    assert v["per_seed"][0]["ci"] == d["per_seed"][0]["ci"] and v["pooled"] == d["pooled"]
    other_full = full.copy()
    other_full[0] = 1 - other_full[0]
    elsewhere = _fake_seed(tmp_path / "elsewhere", 21, {"full": other_full, "abridge_c256_perlayer": new})
    with pytest.raises(SystemExit, match="committed abridge was paired with another full KV"):
        seeds.run([elsewhere], None, ["abridge_c256_perlayer:committed/abridge"], committed=earlier)
    with pytest.raises(SystemExit, match="need the file: give --committed"):
        seeds.run([later], None, ["abridge_c256_perlayer:committed/abridge"])
    with pytest.raises(SystemExit, match="no such file"):
        seeds.run([later], None, [], committed=tmp_path / "missing.json")


def test_kept_committed_arms_are_carried_over_unchanged_only_over_the_same_full_kv(tmp_path):
    """--keep-committed: an earlier run's rows against full KV appear unchanged (marked) beside the new arms, where
    the committed full KV equals the new one on every seed; another full KV, other seeds or an unknown arm are refused."""
    rng = np.random.default_rng(2)
    full_a, full_b, kvzap_a, kvzap_b, new_a, new_b = (rng.integers(0, 2, 40) for _ in range(6))
    a = _fake_seed(tmp_path / "old", 31, {"full": full_a, "kvzap@-5.75": kvzap_a})
    b = _fake_seed(tmp_path / "old", 32, {"full": full_b, "kvzap@-5.75": kvzap_b})
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(seeds.run([a, b], None, ["kvzap@-5.75:full"])))
    old_kvzap, old_pair = [c for c in json.loads(earlier.read_text())["comparisons"] if c["arm"] == "kvzap@-5.75"]
    a2 = _fake_seed(tmp_path / "new", 31, {"full": full_a, "abridge": new_a})
    b2 = _fake_seed(tmp_path / "new", 32, {"full": full_b, "abridge": new_b})
    results = seeds.run([a2, b2], None, [], committed=earlier, keep=["kvzap@-5.75", "kvzap@-5.75:full"])
    assert [(c["arm"], c["vs"]) for c in results["comparisons"]] == [
        ("full", "full KV"), ("abridge", "full KV"), ("kvzap@-5.75", "full KV"), ("kvzap@-5.75", "full")]
    kept, pair = results["comparisons"][-2:]
    assert {k: v for k, v in kept.items() if k != "committed"} == old_kvzap and kept["committed"] == str(earlier)
    assert {k: v for k, v in pair.items() if k != "committed"} == old_pair
    assert "| kvzap@-5.75 (committed) | full KV |" in seeds.markdown(results)
    other = full_b.copy()
    other[3] = 1 - other[3]
    b3 = _fake_seed(tmp_path / "other", 32, {"full": other, "abridge": new_b})
    with pytest.raises(SystemExit, match="seed 32: the committed full KV differs"):
        seeds.run([a2, b3], None, [], committed=earlier, keep=["kvzap@-5.75"])
    with pytest.raises(SystemExit, match="has seeds \\[31, 32\\], this run \\[31\\]"):
        seeds.run([a2], None, [], committed=earlier, keep=["kvzap@-5.75"])
    with pytest.raises(SystemExit, match="--keep-committed \\['zoomr'\\]: not in"):
        seeds.run([a2, b2], None, [], committed=earlier, keep=["zoomr"])
    with pytest.raises(SystemExit, match="give --committed"):
        seeds.run([a2, b2], None, [], keep=["kvzap@-5.75"])


def test_an_arm_evaluated_by_hand_into_arms_joins_only_when_named(tmp_path):
    """An ablation run into ``<out>/arms/<arm>`` that results.json does not list is paired with full KV when
    ``--arms``/``--vs`` name it (rows over full KV measured from both runs), and ignored otherwise."""
    rng = np.random.default_rng(1)
    full, abridge_uniform, extra = (rng.integers(0, 2, 60) for _ in range(3))
    out = _fake_seed(tmp_path, 21, {"full": full, "abridge_uniform": abridge_uniform})
    run = out / "arms" / "abridge_k2q"
    run.mkdir()
    rows = [{**ROW, "problem_id": f"testbed-21-{i}", "correct": bool(c), "kv": {"rows_mean": 25.0}}
            for i, c in enumerate(extra)]  # fmt: skip
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "metrics.json").write_text(json.dumps({"pooled": {}}))
    assert {c["arm"] for c in seeds.run([out], None, [])["comparisons"]} == {"full", "abridge_uniform"}
    results = seeds.run([out], ["abridge_k2q"], ["abridge_k2q:abridge_uniform"])
    by_arm = {(c["arm"], c["vs"]): c for c in results["comparisons"]}
    (s,) = by_arm[("abridge_k2q", "full KV")]["per_seed"]
    assert s["delta"] == pytest.approx(np.mean(extra - full)) and s["rows_over_full"] == pytest.approx(0.25)
    (v,) = by_arm[("abridge_k2q", "abridge_uniform")]["per_seed"]
    assert v["delta"] == pytest.approx(np.mean(extra - abridge_uniform))
    with pytest.raises(SystemExit, match=r"arm\(s\) \['abridge_missing'\] ran on none"):
        seeds.run([out], ["abridge_missing"], [])


def test_an_output_made_under_the_arm_names_before_the_rename_is_read_under_the_new_ones(tmp_path, capsys):
    """Before 2026-12-06 ``abridge`` was the uniform model and ``abridge_perlayer`` the paper's AbridgeKV: the default
    pairs (``abridge:evict_*``) read such an output's uniform model as AbridgeKV without a word. Its arms are read
    under the new names (from their old folders); an output mixing both namings is refused."""
    rng = np.random.default_rng(3)
    perlayer, uniform, evict = (rng.integers(0, 2, 50) for _ in range(3))
    old = _fake_seed(tmp_path / "old", 41, {"full": [1] * 50, "abridge_perlayer": perlayer, "abridge": uniform,
                                           "evict_random": evict})  # fmt: skip
    results = seeds.run([old], None)
    assert "abridge_perlayer -> abridge, abridge -> abridge_uniform" in capsys.readouterr().out
    by_arm = {(c["arm"], c["vs"]): c["per_seed"][0] for c in results["comparisons"]}
    assert by_arm[("abridge", "full KV")]["correct"] == "".join(map(str, perlayer))
    assert by_arm[("abridge_uniform", "full KV")]["correct"] == "".join(map(str, uniform))
    assert by_arm[("abridge", "evict_random")]["delta"] == pytest.approx(np.mean(perlayer - evict))
    mixed = _fake_seed(tmp_path / "mixed", 42, {"full": [1, 1], "abridge_perlayer": [1, 0], "abridge_uniform": [0, 0]})
    with pytest.raises(SystemExit, match=r"mixes the arm names before 2026-12-06 \(\['abridge_perlayer'\]\) with the "
                       r"new ones \(\['abridge_uniform'\]\)"):
        seeds.run([mixed], None)


def test_an_out_that_is_one_of_the_inputs_is_refused_before_it_is_overwritten(tmp_path, capsys):
    """``--out`` = an input replaced that miniature output's results.json and table.md with this script's (the
    miniature's own table lost, the directory no longer an input of this script or of a --merge)."""
    a = _fake_seed(tmp_path, 11, {"full": [1, 0, 1], "abridge": [1, 1, 0]})
    b = _fake_seed(tmp_path, 12, {"full": [1, 1], "abridge": [0, 1]})
    before = (a / "results.json").read_bytes()
    with pytest.raises(SystemExit) as exc:
        seeds.main([str(b), str(a), "--out", f"{a}/"])
    assert exc.value.code == 2 and f"--out {a} is the input {a}" in capsys.readouterr().err
    assert (a / "results.json").read_bytes() == before and not (a / "table.md").exists()


def test_a_report_cut_short_while_writing_leaves_the_old_results_json_whole(tmp_path):
    """results.json (the ``--committed`` input of a later run) was written in place: a kill mid-write left it torn.
    Each file is renamed into place whole now."""
    a = _fake_seed(tmp_path, 11, {"full": [1, 0, 1], "abridge": [1, 1, 0]})
    out = tmp_path / "report"
    seeds.main([str(a), "--out", str(out)])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    from torn_writes import writes_torn

    with writes_torn("results.json"), pytest.raises(KeyboardInterrupt):
        seeds.main([str(a), "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # whole, and no temporary file left


def test_an_arm_of_no_or_one_problem_is_refused_by_name(tmp_path):
    """An emptied results.jsonl and a one-problem run were ValueError tracebacks from inside the bootstrap."""
    from zoomr.jsonl import BadRowError

    one = _fake_seed(tmp_path, 11, {"full": [1], "abridge": [0]})
    with pytest.raises(SystemExit, match=rf"seed 11 \({one}\): abridge and full ran 1 problem; a paired interval"):
        seeds.run([one], ["abridge"], [])
    empty = _fake_seed(tmp_path, 12, {"full": [1, 0], "abridge": [0, 1]})
    (empty / "arms" / "abridge" / "results.jsonl").write_text("")
    with pytest.raises(BadRowError, match=rf"{empty / 'arms' / 'abridge' / 'results.jsonl'}: no result rows"):
        seeds.run([empty], ["abridge"], [])
