"""End to end through the entry points' configs: pairs → fit → checkpoints → policy (KVzap paper §4.1)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from zoomr.entry import CONF_DIR
from zoomr.kvzap.flops import KNOWN, ratio, shapes_of
from zoomr.kvzap.surrogate import load_surrogate
from zoomr.models import tiny_config
from zoomr.schemas import register_with_hydra


def _compose(primary: str, overrides: list[str]):
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(primary, overrides=overrides)


SMALL = [
    "pipeline.min_tokens=60", "pipeline.max_tokens=90", "pipeline.max_docs_per_subset=5",
    "pipeline.val_docs_per_subset=2", "pipeline.tokens_per_doc=40", "pipeline.docs_per_shard=8",
]  # fmt: skip
# 160 training documents of 150-250 tokens, 100 pairs each: 16,000 training pairs per head
MEDIUM = [
    "pipeline.min_tokens=150", "pipeline.max_tokens=250", "pipeline.max_docs_per_subset=40",
    "pipeline.val_docs_per_subset=5", "pipeline.tokens_per_doc=100",
]  # fmt: skip


def pairs_and_fit(tmp_path, cache_dir, pipeline: list[str], fit: list[str]):
    from data_prep.kvzap_pairs import run as make_pairs
    from train.kvzap import run as run_fit

    common = [f"cache_dir={cache_dir}", "logger.mode=disabled", "model=tiny-qwen2"]
    cfg = _compose(
        "data_prep",
        [
            "+pipeline=kvzap_pairs",
            f"run_dir={tmp_path}/dp",
            f"pipeline.out_dir={tmp_path}/pairs",
            *pipeline,
            *common,
        ],
    )
    pairs = make_pairs(cfg)
    cfg = _compose("train", [*cfg_overrides(tmp_path, cache_dir), *fit])
    return pairs, run_fit(cfg), cfg


def cfg_overrides(tmp_path, cache_dir) -> list[str]:
    return [
        "+method=kvzap", f"run_dir={tmp_path}/fit", f"method.pairs_dir={tmp_path}/pairs",
        f"method.surrogate_dir={tmp_path}/surrogates", f"cache_dir={cache_dir}", "logger.mode=disabled",
        "model=tiny-qwen2",
    ]  # fmt: skip


def layer_means(run_dir, metric: str) -> dict[tuple[str, int], float]:
    rows = list(csv.DictReader((run_dir / "r2.csv").open()))
    out: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        out.setdefault((r["kind"], int(r["layer"])), []).append(float(r[metric]))
    return {k: sum(v) / len(v) for k, v in out.items()}


def test_pairs_then_fit_through_the_configs(tmp_path, cache_dir):
    """The paper's recipe (ridge; MLP 15 epochs, AdamW 5e-3, batch 512) on the random tiny model: at layer 0,
    where its scores are most predictable from the hidden state, both surrogates beat the constant predictor
    on held-out determination (1 - SSE/SST; squared Pearson is 0 for a constant). Deeper layers need far more
    documents (the full pipeline: 1,029 documents, 514,500 pairs; numbers in the KVzap README section)."""
    pairs, summary, cfg = pairs_and_fit(tmp_path, cache_dir, MEDIUM, [])
    assert summary["pairs"].startswith("16000 train / 2000 held-out")
    assert pairs["pairs_train"] == 16000 and pairs["pairs_val"] == 2000
    assert json.loads((tmp_path / "dp" / "summary.json").read_text())["pairs_val"] == 2000
    for kind, hidden in (("linear", None), ("mlp", 32)):
        model = load_surrogate(tmp_path / "surrogates" / kind)
        assert (model.config.input_dim, model.config.output_dim, model.config.n_modules) == (256, 2, 4)
        assert model.config.hidden_dim == hidden
        assert 0 < summary[f"r2_{kind}"] <= 1
    rows = list(csv.DictReader((tmp_path / "fit" / "r2.csv").open()))
    assert len(rows) == 2 * 4 * 2 and {r["kind"] for r in rows} == {"linear", "mlp"}
    det, const = layer_means(tmp_path / "fit", "det"), layer_means(tmp_path / "fit", "const_det")
    mse, const_mse = layer_means(tmp_path / "fit", "mse"), layer_means(tmp_path / "fit", "const_mse")
    for kind in ("linear", "mlp"):
        assert det[(kind, 0)] > const[(kind, 0)] + 0.05, (kind, det, const)
        assert mse[(kind, 0)] < 0.95 * const_mse[(kind, 0)], (kind, mse, const_mse)
    # the constant predictor's figures are in the summary: R² 0 (no variance), its MSE the targets' spread
    assert summary["r2_constant"] == 0.0 and summary["mse_constant"] > 0
    assert {"const_r2", "const_det", "const_mse"} <= set(rows[0])
    assert (tmp_path / "fit" / "r2_per_layer.png").stat().st_size > 1000
    assert (summary["plot"], summary["table"]) == (str(tmp_path / "fit" / "r2_per_layer.png"), str(tmp_path / "fit" / "r2.csv"))
    # a rerun returns the finished fit untouched; another setting in the same run directory is refused
    from train.kvzap import run as run_fit

    written = (tmp_path / "fit" / "r2.csv").stat().st_mtime_ns
    assert run_fit(cfg) == summary and (tmp_path / "fit" / "r2.csv").stat().st_mtime_ns == written
    with pytest.raises(SystemExit, match="method.fit.ridge_alpha: was"):
        run_fit(_compose("train", [*cfg_overrides(tmp_path, cache_dir), "method.fit.ridge_alpha=7"]))
    # another fit (its own run directory) into the same surrogate_dir was written over this one without a word
    weights = (tmp_path / "surrogates" / "mlp" / "model.safetensors").stat().st_mtime_ns
    record = json.loads((tmp_path / "surrogates" / "mlp" / "fitted_by.json").read_text())
    assert record == {"run_dir": str(tmp_path / "fit"), "model": None}  # a tiny model built from its config: no path
    other = [*cfg_overrides(tmp_path, cache_dir), f"run_dir={tmp_path}/fit2", "method.fit.ridge_alpha=7"]
    with pytest.raises(SystemExit, match=f"holds surrogates written by the fit in {tmp_path / 'fit'}; this fit would"):
        run_fit(_compose("train", other))
    assert (tmp_path / "surrogates" / "mlp" / "model.safetensors").stat().st_mtime_ns == weights
    # the fitted surrogate's checkpoint drives the policy through the method config
    from zoomr.cache import build_policy

    policy = build_policy(cfg.method, tiny_config("qwen2", vocab_size=64))
    assert policy.surrogate.kind == "mlp" and policy.config.threshold == -4.0


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory, cache_dir) -> Path:
    """KVzap pairs of tiny-qwen2 from two one-document subsets (read only by the tests that use them)."""
    from data_prep.kvzap_pairs import run as make_pairs

    tmp = tmp_path_factory.mktemp("tiny_pairs")
    make_pairs(_compose("data_prep", ["+pipeline=kvzap_pairs", f"run_dir={tmp}/dp", f"pipeline.out_dir={tmp}/pairs",
                                      *SMALL[:2], "pipeline.max_docs_per_subset=1", "pipeline.val_docs_per_subset=1",
                                      "pipeline.tokens_per_doc=10", f"cache_dir={cache_dir}",
                                      "logger.mode=disabled"]))  # fmt: skip
    return tmp / "pairs"


def test_fit_refuses_pairs_of_another_model(tmp_path, cache_dir, tiny_pairs):
    from train.kvzap import run as fit

    common = [f"cache_dir={cache_dir}", "logger.mode=disabled"]
    cfg = _compose("train", ["+method=kvzap", "model=tiny-llama", f"run_dir={tmp_path}/fit",
                             f"method.pairs_dir={tiny_pairs}", *common])  # fmt: skip
    with pytest.raises(SystemExit, match="come from model 'tiny-qwen2'"):
        fit(cfg)
    with pytest.raises(FileNotFoundError, match="python -m data_prep"):
        fit(_compose("train", ["+method=kvzap", f"method.pairs_dir={tmp_path}/none", *common]))


def test_a_second_fit_into_a_surrogate_dir_being_written_is_refused(tmp_path, cache_dir, tiny_pairs):
    """Two fits of other run directories into one empty ``method.surrogate_dir`` (a sweep over fit settings with
    the per-model default) both passed the check for another fit's surrogates, then wrote linear/ and mlp/ in turn,
    each recording itself in fitted_by.json: one summary described the other's surrogates. The second is refused."""
    from train.kvzap import run as fit
    from zoomr.runlock import RunLock

    out = tmp_path / "surrogates"
    taken = f"{out} is being written by another KVzap fit .*give this fit its own method.surrogate_dir"
    with RunLock(out, "KVzap fit"), pytest.raises(SystemExit, match=taken):  # the first fit, still fitting
        fit(_compose("train", [*cfg_overrides(tmp_path, cache_dir), f"method.pairs_dir={tiny_pairs}"]))
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_flop_ratios_match_the_paper_bounds():
    """Paper §4.2: at most 1.1% (MLP) and 0.02% (linear) of the linear-layer compute."""
    rows = {name: ratio(name, **shape) for name, shape in KNOWN.items()}
    q = rows["Qwen3-8B"]
    assert q.model_macs_per_layer == 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 12288
    assert 0.010 < q.mlp_ratio < 0.011 and 0.00015 < q.linear_ratio < 0.0002
    assert all(r.mlp_ratio < 0.011 and r.linear_ratio < 0.0002 for n, r in rows.items() if "tiny" not in n)
    assert shapes_of(tiny_config("qwen2", vocab_size=64)) == KNOWN["tiny (foundation default)"]



def test_flops_prints_its_table_once_and_writes_the_json_only_when_asked(tmp_path, capsys):
    """``python -m zoomr.kvzap.flops`` printed its table, then the same numbers again as JSON (0.00015024038461538462)."""
    from zoomr.kvzap.flops import main

    main([])
    out = capsys.readouterr().out
    assert "KVzap-Linear" in out and "0.0150%" in out and "linear_ratio" not in out and len(out.splitlines()) == 5
    rows = main(["--json", str(tmp_path / "flops.json")])
    assert json.loads((tmp_path / "flops.json").read_text())[0]["linear_ratio"] == rows[0].linear_ratio
    assert capsys.readouterr().out.endswith(f"written {tmp_path / 'flops.json'}\n")


def test_documents_past_the_models_context_are_refused_before_any_state(tmp_path):
    """``pipeline.min_tokens=max_tokens=100000`` packed documents past the tiny model's 32,768 positions and scored
    their 200K-token repeat pretexts for hours (killed here after 5 min); now refused by name, nothing written."""
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run(
        [sys.executable, "-m", "data_prep", "+pipeline=kvzap_pairs", f"pipeline.out_dir={tmp_path / 'pairs'}",
         "pipeline.min_tokens=100000", "pipeline.max_tokens=100000", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert "invalid settings: pipeline.max_tokens=100000: the repeat pretext holds each document twice" in proc.stderr
    assert "past the model's 32768 positions" in proc.stderr
    assert not (tmp_path / "pairs").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "plan", "message"),
    [
        (["pipeline.testbed.data.trace_tokens=10"], None, "testbed.trace_tokens=10 is too short"),
        ([], {"format": "another plan"}, "holds pairs of a different plan"),
    ],
    ids=["documents-that-cannot-be-made", "another-plan"],
)
def test_testbed_pairs_that_cannot_be_made_here_are_refused_before_the_run_directory(tmp_path, overrides, plan, message):
    """Both refusals came after the run directory's config.json was written (the documents were planned, and the
    out_dir's plan compared, only once the run had started); now before any run state, through the entry point's
    own function (Hydra passthrough). The out_dir's plan is left as it was."""
    from data_prep.__main__ import main

    out = tmp_path / "pairs"
    if plan is not None:
        out.mkdir()
        (out / "plan.json").write_text(json.dumps(plan))
    cfg = _compose("data_prep", [
        "+pipeline=kvzap_pairs_testbed", "model=tiny-testbed", "model.hf_id=analysis/results/miniature/base_model",
        "pipeline.testbed.n_train=4", "pipeline.testbed.n_val=1", f"pipeline.out_dir={out}", "logger=none",
        f"run_dir={tmp_path / 'run'}", "hydra.runtime.output_dir=.", *overrides])  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main(cfg)
    assert isinstance(stop.value.code, str) and message in stop.value.code
    assert not (tmp_path / "run").exists()
    assert sorted(p.name for p in out.iterdir()) == ["plan.json"] if plan else not out.exists()
    if plan:
        assert json.loads((out / "plan.json").read_text()) == plan



def test_pairs_and_their_fit_are_grouped_in_wandb_under_the_pairs_not_the_unused_data(tmp_path, cache_dir, monkeypatch):
    """Neither the pairs pipeline nor the fit reads ``data``: both were grouped (and the pipeline's run named) under
    the entries' ``data=traces`` default, ``tiny-qwen2/traces``, beside the SFT runs on those traces; now both are in
    ``tiny-qwen2/kvzap_pairs``."""
    from types import SimpleNamespace

    import wandb

    import zoomr.entry
    from data_prep.kvzap_pairs import run as make_pairs
    from train.kvzap import run as run_fit

    asked, start_run = [], zoomr.entry.start_run
    run = SimpleNamespace(summary={}, config=SimpleNamespace(update=lambda *a, **kw: None), log=lambda *a, **kw: None,
                          finish=lambda: None)
    monkeypatch.setattr(wandb, "init", lambda **kw: asked.append(kw) or run)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    text = tmp_path / "docs.txt"  # four documents of 70 words: a plan of its own, not the vendored sources' tokens
    text.write_text("\n".join(" ".join(f"w{d}x{i}" for i in range(70)) for d in range(4)) + "\n")
    pairs = _compose("data_prep", [
        "+pipeline=kvzap_pairs", f"run_dir={tmp_path}/dp", f"pipeline.out_dir={tmp_path}/pairs", *SMALL[:2],
        f"pipeline.sources=[{{name: web, path: '{text}', format: lines}}]", "pipeline.max_docs_per_subset=3",
        "pipeline.val_docs_per_subset=1", "pipeline.tokens_per_doc=10", f"cache_dir={cache_dir}",
        "logger.mode=offline", "model=tiny-qwen2"])  # fmt: skip
    for _ in range(2):  # a rerun (keeping the complete shards) resumes the pipeline's W&B run
        make_pairs(pairs)
    assert asked[0]["id"] == asked.pop()["id"] and asked[0]["resume"] == "allow"

    class Started(Exception):
        pass

    def started(*args, **kwargs):  # the fit's W&B run starts; the fit itself is not what this test is about
        start_run(*args, **kwargs)
        raise Started

    monkeypatch.setattr(zoomr.entry, "start_run", started)
    fit = [o.replace("logger.mode=disabled", "logger.mode=offline") for o in cfg_overrides(tmp_path, cache_dir)]
    with pytest.raises(Started):
        run_fit(_compose("train", fit))
    assert [(kw["job_type"], kw["group"], kw["name"]) for kw in asked] == [
        ("data_prep", "tiny-qwen2/kvzap_pairs", "kvzap_pairs-tiny-qwen2"),
        ("train", "tiny-qwen2/kvzap_pairs", "kvzap-tiny-qwen2-traces-kvzap_pairs"),
    ]

