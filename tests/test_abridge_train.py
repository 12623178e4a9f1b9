"""AbridgeKV recipes end to end on the tiny model: configs compose, training runs, resumes, allocates."""

from __future__ import annotations

import json
import shutil

import pytest
from hydra import compose, initialize_config_dir

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
        assert (m.block_size, m.num_pause, m.quota) == (64, 16, 16)  # 4:1, the paper's ratio
        # the tiny default fine-tunes the shipped testbed base model on the testbed (the README's main job)
        assert (cfg.model.name, cfg.data.name) == ("tiny-testbed", "testbed")
        assert m.init_from == "analysis/results/miniature/base_model"
        assert (REPO_ROOT / m.init_from / "model.safetensors").is_file()
        other = to_dataclass(cls, _compose(method, ["model=tiny-llama", "data=traces"]).method)
        assert other.init_from is None  # any other model starts from its own weights
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
    summary = allocate.run(acfg)
    schedule = json.loads((alloc_dir / "schedule.json").read_text())
    assert sorted(schedule["quotas"]) == [1, 1, 2, 4] and len(schedule["costs"]) == 4
    assert (alloc_dir / "layer_costs.png").stat().st_size > 0
    assert "method.schedule=" in summary["next"]
    written = (alloc_dir / "schedule.json").stat().st_mtime_ns
    assert allocate.run(acfg) == summary and (alloc_dir / "schedule.json").stat().st_mtime_ns == written
