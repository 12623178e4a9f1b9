"""AbridgeKV recipes end to end on the tiny model: configs compose, training runs, resumes, allocates."""

from __future__ import annotations

import json
import shutil

import pytest
from hydra import compose, initialize_config_dir

from zoomr.abridge.quotas import resolve_quotas
from zoomr.cache.abridge import AbridgeMethod
from zoomr.entry import CONF_DIR
from zoomr.paths import REPO_ROOT
from zoomr.schemas import register_with_hydra, to_dataclass
from zoomr.schemas.abridge import AbridgeAllocateMethod

TINY_RUN = [
    "model=tiny-qwen2",  # real-trace path (the tiny default is the testbed)
    "data=traces",
    "method.quota=null",  # num_pause // 2
    "method.max_steps=4",
    "method.per_device_batch_size=2",
    "method.max_response_tokens=40",
    "method.block_size=8",
    "method.num_pause=4",
    "method.heldout_examples=2",
    "method.logging_steps=1",
    "method.eval_steps=2",
    "method.save_steps=2",
    "data.max_samples=8",
    "logger=none",
]


def _compose(method: str, overrides: list[str], run_dir=None):
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        extra = [f"run_dir={run_dir}", "hydra.runtime.output_dir=."] if run_dir else []
        return compose("train", overrides=[f"+method={method}", *overrides, *extra])


@pytest.mark.parametrize(
    "method,cls", [("abridge", AbridgeMethod), ("abridge_allocate", AbridgeAllocateMethod)]
)
def test_configs_compose_into_their_schemas(method, cls):
    cfg = _compose(method, [])
    m = to_dataclass(cls, cfg.method)
    assert m.trainer == method
    if method == "abridge":
        # the tiny default fine-tunes the shipped testbed base model on the testbed (the README's main job) at
        # C = 256 on the per-layer schedule the miniature allocated from that base: mean quota 64 of 256, 4:1
        assert (m.block_size, m.num_pause, m.quota) == (256, 128, None)
        assert (cfg.model.name, cfg.data.name) == ("tiny-testbed", "testbed")
        assert m.init_from == "analysis/results/miniature/base_model"
        assert (REPO_ROOT / m.init_from / "model.safetensors").is_file()
        quotas = resolve_quotas(3, m.num_pause, m.quota, m.schedule)
        assert quotas == [32, 128, 32] and sum(quotas) / len(quotas) * 4 == m.block_size
        other = to_dataclass(cls, _compose(method, ["model=tiny-llama", "data=traces"]).method)
        assert other.init_from is None and other.schedule is None  # any other model: its own weights, uniform
        moved = to_dataclass(cls, _compose(method, ["method.init_from=runs/train/other-base/final"]).method)
        assert moved.schedule is None  # the shipped schedule goes with the shipped start model only
        assert resolve_quotas(3, 128, None, moved.schedule) == [64] * 3
        with pytest.raises(ValueError, match=r"method.quota=16 and method.schedule=.*give one of them"):
            to_dataclass(cls, _compose(method, ["method.quota=16"]).method)  # the schedule would win silently
        uniform = to_dataclass(cls, _compose(method, ["method.quota=16", "method.schedule=null"]).method)
        assert resolve_quotas(3, uniform.num_pause, uniform.quota, uniform.schedule) == [16] * 3
        assert (m.optim.adam_beta1, m.optim.adam_beta2, m.optim.weight_decay) == (0.9, 0.95, 0.1)
        assert (m.optim.warmup_fraction, m.optim.decay_start_fraction, m.optim.final_lr_fraction) == (
            0.03,
            0.8,
            0.1,
        )
    else:
        assert m.checkpoint == "runs/train/abridge-tiny-qwen2-traces/final"


def test_train_resume_and_allocate(tmp_path, cache_dir):
    import train.abridge as recipe
    import train.abridge_allocate as allocate

    run_dir = tmp_path / "run"
    cfg = _compose("abridge", [*TINY_RUN, f"cache_dir={cache_dir}"], run_dir)
    first = recipe.run(cfg)
    assert first["steps"] == 4 and first["resumed_from"] == "-"
    assert first["loss_end"] < first["loss_start"]
    saved = json.loads((run_dir / "final" / "abridge.json").read_text())
    assert saved["quotas"] == [2, 2, 2, 2] and saved["layout"]["block_size"] == 8

    more = [*TINY_RUN, "method.max_steps=6", "method.gradient_checkpointing=true", f"cache_dir={cache_dir}"]
    second = recipe.run(_compose("abridge", more, run_dir))
    assert second["resumed_from"].endswith("checkpoint-4") and second["steps"] == 6
    # killed after its last checkpoint (no summary yet): the rerun restores checkpoint-6, trains nothing
    shutil.rmtree(run_dir / "final")
    (run_dir / "summary.json").unlink()
    third = recipe.run(_compose("abridge", more, run_dir))
    assert third["resumed_from"].endswith("checkpoint-6") and third["steps"] == 6
    assert third["heldout_ce_abridge"] == pytest.approx(second["heldout_ce_abridge"], abs=1e-4)
    assert third["train_loss"] == pytest.approx(second["train_loss"], rel=1e-6)
    config = (run_dir / "config.json").read_bytes()
    with pytest.raises(SystemExit, match=r"derived\.quotas: was \[2, 2, 2, 2\], now \[1, 1, 1, 1\]"):
        recipe.run(_compose("abridge", [*more, "method.quota=1"], run_dir))  # another schedule: refused
    assert (run_dir / "config.json").read_bytes() == config  # ... before the run's config is rewritten

    alloc_dir = tmp_path / "alloc"
    acfg = _compose(
        "abridge_allocate",
        [
            f"method.checkpoint={run_dir / 'final'}",
            "data.max_samples=8",
            "logger=none",
            f"cache_dir={cache_dir}",
        ],
        alloc_dir,
    )
    logged = {}  # what W&B's summary gets (the printed block is all text: the run had no summary numbers)

    def start_run(*args, **kwargs):
        run_dir, logger = start(*args, **kwargs)
        logger.summary = logged.update
        return run_dir, logger

    start, allocate.start_run = allocate.start_run, start_run
    try:
        summary = allocate.run(acfg)
    finally:
        allocate.start_run = start
    schedule = json.loads((alloc_dir / "schedule.json").read_text())
    assert sorted(schedule["quotas"]) == [1, 1, 2, 4] and len(schedule["costs"]) == 4
    assert logged["base_heldout_ce"] == schedule["base_heldout_ce"] and logged["schedule_mean"] == 2
    assert [logged[f"layer_{i}_ce_increase"] for i in range(4)] == schedule["costs"]
    assert [logged[f"layer_{i}_quota"] for i in range(4)] == schedule["quotas"]
    assert (alloc_dir / "layer_costs.png").stat().st_size > 0
    assert "method.schedule=" in summary["next"]
    written = (alloc_dir / "schedule.json").stat().st_mtime_ns
    assert allocate.run(acfg) == summary and (alloc_dir / "schedule.json").stat().st_mtime_ns == written

    per_layer = tmp_path / "per_layer"  # a per-layer model cannot be halved layer by layer: refused, naming the way
    shutil.copytree(run_dir / "final", per_layer)
    config = json.loads((per_layer / "abridge.json").read_text())
    (per_layer / "abridge.json").write_text(json.dumps({**config, "quotas": [1, 1, 2, 4]}))
    with pytest.raises(SystemExit, match=r"non-uniform schedule \[1, 1, 2, 4\].*method.schedule=null"):
        allocate.run(_compose("abridge_allocate", [f"method.checkpoint={per_layer}", "logger=none"], tmp_path / "a2"))
    assert not (tmp_path / "a2").exists()
