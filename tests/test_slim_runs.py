"""Slim run copies (analysis/slim_runs.py) feed ``paper_tables`` exactly as the originals do, and the committed
miniature copies regenerate the committed paper tables (issue 16)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analysis.slim_runs import DROPPED, slim_runs

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_RUNS = ROOT / "analysis/results/miniature/runs"
COMMITTED_TABLES = ROOT / "analysis/results/paper_miniature"


def _eval_run(run_dir: Path, hf_id: str | None) -> Path:
    from tests.test_eval_runner import _fake_run

    _fake_run(run_dir, "abridge", 0.5)
    config = json.loads((run_dir / "config.json").read_text())
    config["model"] = {"name": "tiny", **({"hf_id": hf_id} if hf_id else {})}
    (run_dir / "config.json").write_text(json.dumps(config))
    rows = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    with (run_dir / "results.jsonl").open("w") as f:
        for r in rows:
            f.write(
                json.dumps({**r, "text": "long " * 50, "recall": [{"key": "k1", "correct": True}]}) + "\n"
            )
    return run_dir


def test_slim_copy_keeps_scalars_drops_text_and_keeps_the_models_family(tmp_path, monkeypatch):
    from analysis.paper_tables.inputs import discover

    monkeypatch.chdir(tmp_path)
    base = tmp_path / "runs/train/base/final"
    ft = tmp_path / "runs/train/ft"
    base.mkdir(parents=True)
    (ft / "final").mkdir(parents=True)
    (ft / "config.json").write_text(json.dumps({"method": {"init_from": str(base)}}))
    src = _eval_run(tmp_path / "runs/eval/abridge", str(ft / "final"))

    written = slim_runs([tmp_path / "runs/eval"], tmp_path / "slim")
    assert list(written) == ["eval/abridge"]
    slim = tmp_path / "slim/eval/abridge"
    rows = [json.loads(x) for x in (slim / "results.jsonl").read_text().splitlines()]
    orig = [json.loads(x) for x in (src / "results.jsonl").read_text().splitlines()]
    assert len(rows) == len(orig) and all(r["slim"] for r in rows)
    assert all(not set(DROPPED) & set(r) for r in rows)
    assert [(r["problem_id"], r["correct"], r["n_tokens"]) for r in rows] == [
        (r["problem_id"], r["correct"], r["n_tokens"]) for r in orig
    ]
    model = json.loads((slim / "config.json").read_text())["model"]
    assert (
        "hf_id" not in model and model["evaluated_checkpoint"] == "runs/train/ft/final"
    )  # relative to the cwd
    from analysis.slim_runs import evaluated_config

    restored = evaluated_config(json.loads((slim / "config.json").read_text()))["model"]  # the inverse, for timing
    assert restored["hf_id"] == "runs/train/ft/final" and "evaluated_checkpoint" not in restored
    unslimmed = json.loads((src / "config.json").read_text())
    assert evaluated_config(unslimmed) == unslimmed  # a config naming its model in hf_id stays as it is

    # grouped under the base model, like the original, although no checkpoint is reachable from the copy
    original, copy = discover([str(tmp_path / "runs/eval/**")]), discover([str(tmp_path / "slim/**")])
    assert [a.model for a in copy.evals] == [a.model for a in original.evals] == ["base"]
    assert copy.evals[0].pooled == original.evals[0].pooled


def test_a_bench_json_is_pointed_at_the_copies_of_the_runs_it_timed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _eval_run(tmp_path / "runs/eval/full", None)
    bench = tmp_path / "bench_throughput.json"
    bench.write_text(json.dumps({"throughput": {}, "finish": [{"run": "runs/eval/full"}, {"run": str(tmp_path / "runs/eval/full")}, {"run": "elsewhere"}]}))
    slim_runs([tmp_path / "runs/eval", bench], tmp_path / "slim")
    finish = json.loads((tmp_path / "slim/bench_throughput.json").read_text())["finish"]
    assert [f["run"] for f in finish] == ["slim/eval/full"] * 2 + ["elsewhere"]  # relative to the cwd


def test_slim_runs_refuses_a_folder_without_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="holds no run directory"):
        slim_runs([tmp_path / "empty"], tmp_path / "out")
    with pytest.raises(SystemExit, match="does not exist"):
        slim_runs([tmp_path / "missing"], tmp_path / "out")


def test_runs_under_a_folder_named_like_a_pruned_one_are_found(tmp_path):
    """Folders named ``final``, ``checkpoints``, ``wandb`` … are pruned below a source, not above it: runs under
    ``/scratch/final/runs`` were refused as 'no run directory' (the same runs given as ``runs`` from inside were
    copied). Below the source they are still pruned."""
    from analysis.slim_runs import run_dirs

    for run in ("final/runs/arm", "final/runs/arm/final/inner", "final/runs/b/checkpoints/c"):
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "config.json").write_text("{}")
        (tmp_path / run / "results.jsonl").write_text("")
    assert run_dirs(tmp_path / "final/runs") == [tmp_path / "final/runs/arm"]


def test_slim_runs_never_writes_into_what_it_copies(tmp_path):
    """``--out`` = the runs' parent slimmed each run in place: its results.jsonl was emptied (read while rewritten)."""
    from zoomr.jsonl import BadRowError

    runs = tmp_path / "runs"
    run = _eval_run(runs / "abridge", None)
    before = (run / "results.jsonl").read_bytes()
    for sources, out in (([run], runs), ([runs], runs), ([runs], runs / "inner"), ([runs], tmp_path)):
        with pytest.raises(SystemExit, match="would write into its sources"):
            slim_runs(sources, out)
    assert (run / "results.jsonl").read_bytes() == before and not (runs / "inner").exists()
    with (run / "results.jsonl").open("a") as f:
        f.write('{"problem_id": ')  # a torn row: refused by name, not copied without it
    with pytest.raises(BadRowError, match="results.jsonl line .*: bad_json"):
        slim_runs([run], tmp_path / "out")


def _slimmed_then_renamed(tmp_path: Path, *names: str):
    """Eval runs ``names`` under ``tmp_path/runs`` slimmed into ``tmp_path/out``, then the last one's ``run_name``
    changed at the source: (runs, that run, out, the copy's files before, its original config)."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    *_, last = [_eval_run(runs / n, None) for n in names]
    slim_runs([runs], out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    config = json.loads((last / "config.json").read_text())
    (last / "config.json").write_text(json.dumps({**config, "run_name": "renamed"}))
    return runs, last, out, before, config


def test_an_unreadable_source_leaves_no_copy_written_or_half_updated(tmp_path):
    """A source run with a bad row or a config.json that is not one was found after the runs before it were copied
    and its own JSON files written: a fresh --out was left with a partial copy (no results.jsonl), and re-slimming
    into an existing --out left the run's new config.json beside its old rows. Everything is read first now."""
    from zoomr.jsonl import BadRowError

    runs, b, out, before, config = _slimmed_then_renamed(tmp_path, "a", "b")
    with (b / "results.jsonl").open("a") as f:
        f.write("[1, 2]\n")
    with pytest.raises(BadRowError, match="b/results.jsonl line"):
        slim_runs([runs], out)
    with pytest.raises(BadRowError, match="b/results.jsonl line"):
        slim_runs([runs], tmp_path / "fresh")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "fresh").exists()
    (b / "config.json").write_text(json.dumps({**config, "model": "tiny"}))
    with pytest.raises(BadRowError, match="b/config.json: model is not an object"):
        slim_runs([runs], tmp_path / "fresh")
    (b / "config.json").write_text("[]")
    with pytest.raises(BadRowError, match="b/config.json: expected a JSON object"):
        slim_runs([runs], tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_a_copy_interrupted_while_writing_leaves_the_old_copy_whole(tmp_path, monkeypatch):
    """Re-slimming wrote a copy's files one after the other in place: a kill between them left the run's new
    config.json beside its old rows (or a torn results.jsonl), which paper_tables read as a whole run. Each file is
    written to a temporary name and the copy's files are renamed only once all are written."""
    runs, b, out, before, config = _slimmed_then_renamed(tmp_path, "b")
    (b / "results.jsonl").write_text((b / "results.jsonl").read_text().replace('"correct": true', '"correct": false'))
    write_text, calls = Path.write_text, []

    def killed_at_the_second_file(self, *args, **kwargs):
        calls.append(self.name)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stands in for the kill
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", killed_at_the_second_file)
    with pytest.raises(KeyboardInterrupt):
        slim_runs([runs], out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    monkeypatch.setattr(Path, "write_text", write_text)
    slim_runs([runs], out)
    assert json.loads((out / "runs" / "b" / "config.json").read_text())["run_name"] == "renamed"


def _table_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not re.search(r"UTC|\(\d+(\.\d+)? s\)", line)]


def test_committed_miniature_runs_regenerate_the_committed_paper_tables(tmp_path, monkeypatch):
    """``paper_tables`` over the committed slim copies writes the same tables as the committed output."""
    from analysis.paper_tables import main

    monkeypatch.chdir(ROOT)  # the committed output names its inputs relative to the repo root
    main([str(COMMITTED_RUNS.relative_to(ROOT) / "**"), "--out", str(tmp_path)])
    committed = sorted(p.name for p in COMMITTED_TABLES.glob("*.md") if p.name != "README.md")
    assert committed, "no committed paper tables"
    assert sorted(p.name for p in tmp_path.glob("*.md") if p.name != "README.md") == committed
    for name in committed:
        assert _table_lines(tmp_path / name) == _table_lines(COMMITTED_TABLES / name), name
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(
        p.name for p in COMMITTED_TABLES.glob("*.png")
    )


def test_a_ruler_runs_copy_keeps_its_problem_scope(tmp_path):
    """A RULER / LongBench run lists its problems in ``problems.json`` (:data:`eval.tasks.SCOPE_FILE`); the copy kept
    a ``scope.json`` no run writes, so the copy was an unusable input to paper_tables ("no problems.json")."""
    from eval.compare import load_run
    from tests.test_compare_settings import _ruler_run

    run = _ruler_run(tmp_path / "runs/ruler", ["niah_single_1/0", "niah_single_1/1"], ["niah_single_1/0", "niah_single_1/1"])
    slim_runs([run], tmp_path / "slim")
    copy = load_run(tmp_path / "slim/ruler")
    assert [r["problem_id"] for r in copy.rows] == [r["problem_id"] for r in load_run(run).rows]


def test_two_sources_of_one_name_are_refused_not_copied_onto_each_other(tmp_path):
    """``runs/a/arms runs/b/arms`` both went to ``<out>/arms/<arm>``: b's copy of each arm replaced a's without a
    word, so the copies held one seed's runs under both names."""
    a, b = _eval_run(tmp_path / "a/arms/full", None), _eval_run(tmp_path / "b/arms/full", None)
    with pytest.raises(SystemExit, match=rf"{a} and {b} would both be copied to {tmp_path / 'slim/arms/full'}"):
        slim_runs([tmp_path / "a/arms", tmp_path / "b/arms"], tmp_path / "slim")
    assert not (tmp_path / "slim").exists()
    assert list(slim_runs([tmp_path / "a/arms", tmp_path / "a/arms"], tmp_path / "slim")) == ["arms/full"]  # the same run
