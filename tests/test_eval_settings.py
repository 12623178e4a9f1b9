"""Issue 18, defects 3 and 8 (eval side): every setting is checked before the run writes anything, so the
corrected rerun is accepted; two evals on one run directory are refused; R-KV's threshold is range-checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from eval.__main__ import run
from eval.results import FINGERPRINT_FILE, RESULTS_FILE
from eval.settings import validate
from zoomr.cache.registry import policy_config
from zoomr.entry import CONF_DIR
from zoomr.runlock import RunLock
from zoomr.schemas import register_with_hydra, to_dataclass
from zoomr.schemas.eval import BenchmarkConfig

register_with_hydra()
SMALL = ["benchmark=aime25", "benchmark.problem_limit=1", "generation.n_samples=1", "generation.temperature=0",
         "generation.max_new_tokens=6", "generation.batch_size=1", "grading.workers=1", "logger=none"]  # fmt: skip


def _cfg(run_dir, cache_dir, *overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("eval", overrides=[*SMALL, *overrides, f"run_dir={run_dir}", f"cache_dir={cache_dir}"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["generation.top_p=2"], "top_p=2"),
        (["generation.temperature=-1"], "T=-1"),
        (["generation.temperature=nan"], "T=nan"),  # was torch's "probability tensor contains nan" after config.json
        (["generation.temperature=inf"], "T=inf"),  # was accepted: uniform sampling over the vocabulary
        (["generation.n_samples=0"], "generation.n_samples must be >= 1"),
        (["benchmark.problem_limit=-1"], "benchmark.problem_limit must be >= 1"),
        (["benchmark.problem_limit=0"], "benchmark.problem_limit must be >= 1"),
        # RULER's / LongBench's problems were decoded twice and the second copy's row stopped the run with a traceback
        (["benchmark=ruler", "benchmark.sources=[vt,vt]"], r"benchmark.sources lists \['vt'\] more than once"),
        # was ignored: LongBench and the math sets are read, not generated to a length (the prompts did not change)
        (["benchmark=longbench", "benchmark.length=4096"], "benchmark.length=4096: benchmark 'longbench' does not generate"),
        (["benchmark.length=4096"], "benchmark.length=4096: benchmark 'aime25' does not generate"),
        (["grading.timeout_s=0"], "grading.timeout_s must be > 0"),
        (["grading.timeout_s=inf"], "grading.timeout_s must be > 0 and finite"),  # was an OverflowError traceback
        (["grading.max_error_rate=2"], "grading.max_error_rate must lie in"),
        (["+method=rkv", "method.similarity_threshold=1.5"], "similarity_threshold is a cosine similarity"),
        # was accepted and ignored: rkv_serving compacts every compact_every tokens (rows equal to the default's)
        (["+method=rkv_serving", "method.buffer=0"], "method.buffer=0 would be ignored: rkv_serving compacts"),
        (["+method=streaming", "method.budget_rows=2"], "budget_rows > n_sink"),
        (["+method=kvzip", "method.chunk_size=0"], "method.chunk_size=0"),  # was a traceback after config.json
        (["+method=kvzip", "method.threshold=nan"], "threshold is NaN"),  # was accepted: log s < nan keeps all
        # was accepted: the threshold rule ran, config.json and the fingerprint said ratio 0.3
        (["+method=kvzip", "method.mode=threshold", "method.ratio=0.3"], "method.ratio=0.3 would be ignored with method.mode=threshold"),
        (["+method=kvzip", "method.window=16"], "method.window=16 would be ignored with method.mode=ratio"),
        (["+method=lightthinker", "method.page_size=0"], "method.page_size=0"),  # was a traceback after config.json
        # was accepted and not used (every batch decodes through the policies' SDPA attention), config.json saying
        # eager / flex_attention; flash_attention_2 without its package or a GPU: an ImportError traceback
        (["model.attn_implementation=eager"], "model.attn_implementation=eager would be ignored: eval decodes"),
        (["model.attn_implementation=flex_attention"], "model.attn_implementation=flex_attention would be ignored"),
        (["model.attn_implementation=flash_attention_2"], "model.attn_implementation=flash_attention_2 would be"),
    ],
)
def test_an_invalid_setting_writes_nothing(tmp_path, cache_dir, overrides, message):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match=message) as e:
        run(_cfg(run_dir, cache_dir, *overrides))
    assert "nothing was written" in str(e.value)
    assert not run_dir.exists()  # no fingerprint, no config.json, no lock: the corrected rerun is accepted


def test_the_testbed_on_a_model_without_its_words_is_refused_before_any_run_state(tmp_path, cache_dir):
    """``benchmark=testbed`` on the default tiny-qwen2 (a BPE tokenizer) wrote ``config.json`` and the fingerprint,
    then died building the first script: ``word 'w8' is not in the tokenizer``."""
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match="benchmark 'testbed': the model's tokenizer lacks 359 testbed words") as e:
        run(_cfg(run_dir, cache_dir, "benchmark=testbed", "generation.max_new_tokens=1100"))
    assert "use model=tiny-testbed" in str(e.value)
    assert not run_dir.exists()


def test_a_length_problem_is_not_reported_as_a_sampling_one(tmp_path, cache_dir):
    with pytest.raises(SystemExit) as e:
        run(_cfg(tmp_path / "run", cache_dir, "generation.max_new_tokens=0"))
    line = next(x for x in str(e.value).splitlines() if "max_new_tokens" in x)
    assert "max_new_tokens must be >= 1, got 0" in line and "temperature" not in line


def test_every_problem_is_reported_at_once(tmp_path, cache_dir):
    with pytest.raises(SystemExit) as e:
        run(_cfg(tmp_path, cache_dir, "generation.top_p=2", "benchmark.problem_limit=0", "grading.workers=0"))
    assert all(s in str(e.value) for s in ("top_p=2", "problem_limit", "grading.workers"))


def test_corrected_rerun_after_an_invalid_one_is_accepted(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match="top_p"):
        run(_cfg(run_dir, cache_dir, "generation.top_p=2"))
    metrics = run(_cfg(run_dir, cache_dir))
    assert metrics["pooled"]["samples"] == 1 and (run_dir / FINGERPRINT_FILE).exists()
    assert metrics["grading_this_run"]["failed"] == 0
    assert json.loads((run_dir / "metrics.json").read_text())["grading_this_run"]["graded"] == 1


def test_a_second_eval_on_the_same_run_directory_is_refused(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from zoomr.runlock import RunLock\n"
         f"with RunLock({str(run_dir)!r}):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit, match=rf"being written by another eval \(pid {holder.pid}\)"):
            run(_cfg(run_dir, cache_dir))
        assert not (run_dir / RESULTS_FILE).exists() and not (run_dir / FINGERPRINT_FILE).exists()
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the killed holder's lock; a second holder in this process is refused too
    with RunLock(run_dir), pytest.raises(SystemExit, match="another eval"), RunLock(run_dir):
        pass


def test_a_changed_training_setting_does_not_refuse_resuming_a_served_run(tmp_path, cache_dir):
    """The fingerprint held the whole ``+method=`` node, so a new training default (AbridgeKV's max_steps, its
    optimiser) refused finishing an evaluation of the same checkpoint; a serving setting still refuses."""
    run_dir = tmp_path / "run"
    served = ["+method=abridge", "method.allow_untrained=true", "method.layout_from_checkpoint=false",
              "method.block_size=4", "method.num_pause=2", "method.schedule=null"]  # fmt: skip
    run(_cfg(run_dir, cache_dir, *served, "method.max_steps=10"))
    fp = json.loads((run_dir / FINGERPRINT_FILE).read_text())
    assert "max_steps" not in fp["method"] and "optim" not in fp["method"] and fp["method"]["block_size"] == 4
    metrics = run(_cfg(run_dir, cache_dir, *served, "method.max_steps=99", "method.optim.learning_rate=0.5"))
    assert metrics["pooled"]["samples"] == 1
    with pytest.raises(SystemExit, match="method.block_size: was 4, now 8"):
        run(_cfg(run_dir, cache_dir, *served, "method.block_size=8"))


def test_a_fingerprint_written_with_training_fields_is_read_without_them(tmp_path):
    from eval.results import check_fingerprint
    from zoomr.cache.registry import serving_settings

    method = {"name": "abridge", "policy": "abridge", "block_size": 4, "max_steps": 10, "optim": {"learning_rate": 1}}
    (tmp_path / FINGERPRINT_FILE).write_text(json.dumps({"model": "m", "method": method}))  # as written before
    check_fingerprint(tmp_path, {"model": "m", "method": serving_settings({**method, "max_steps": 50})})
    with pytest.raises(SystemExit, match="method.block_size: was 4, now 5"):
        check_fingerprint(tmp_path, {"model": "m", "method": serving_settings({**method, "block_size": 5})})
    kvzap = {"name": "kvzap", "policy": "kvzap", "threshold": -4.0, "fit": {"epochs": 3}, "pairs_dir": "p"}
    assert serving_settings(kvzap) == {"name": "kvzap", "policy": "kvzap", "threshold": -4.0}
    assert serving_settings({"name": "sft", "lora": {"r": 4}}) == {"name": "sft", "lora": {"r": 4}}  # no policy: as is


def test_a_prompt_length_past_an_unscaled_models_positions_is_refused_before_the_prompts(tmp_path, cache_dir, monkeypatch,
                                                                                         caplog):
    """benchmark.length=40000 on a model trained on 32768 positions (unscaled RoPE) built every prompt and loaded the
    model; the engine then warned at decode. Refused now before the prompts; a scaled RoPE is warned about up front.
    LongBench's max_prompt_tokens past the positions likewise."""
    import eval.steps
    from eval.steps import check_positions
    from eval.tasks import get_task
    from zoomr.models import tiny_config

    def no_prompts(*args, **kwargs):
        raise AssertionError("the prompts were built")

    monkeypatch.setattr(eval.steps, "load_problems", no_prompts)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match="benchmark.length=40000 is past the model's max_position_embeddings=32768 and "
                                         "it scales no RoPE.* use benchmark.length <= 32768"):  # fmt: skip
        run(_cfg(run_dir, cache_dir, "benchmark=ruler", "benchmark.length=40000"))
    assert not run_dir.exists()
    bench = to_dataclass(BenchmarkConfig, _cfg(run_dir, cache_dir, "benchmark=ruler", "benchmark.length=1024").benchmark)
    scaled = tiny_config("qwen2", 300, max_position_embeddings=512, rope_parameters={"rope_type": "linear", "factor": 4.0})
    check_positions(get_task("ruler"), bench, scaled)
    assert "benchmark.length=1024 is past the model's max_position_embeddings=512: taken as covered" in caplog.text
    check_positions(get_task("ruler"), bench, tiny_config("qwen2", 300, max_position_embeddings=1024))  # fits
    longbench = to_dataclass(BenchmarkConfig, _cfg(run_dir, cache_dir, "benchmark=longbench",
                                                   "benchmark.options.max_prompt_tokens=40000").benchmark)  # fmt: skip
    with pytest.raises(ValueError, match="benchmark.options.max_prompt_tokens=40000 is past the model's "
                                         "max_position_embeddings=32768"):  # fmt: skip
        check_positions(get_task("longbench"), longbench, tiny_config("qwen2", 300))
    check_positions(get_task("longbench"), to_dataclass(BenchmarkConfig, _cfg(run_dir, cache_dir, "benchmark=longbench")
                                                        .benchmark), tiny_config("qwen2", 300))  # null: not truncated


def test_a_surrogate_fitted_again_into_the_same_directory_refuses_resuming_the_kvzap_eval(tmp_path):
    """The fingerprint named method.surrogate_dir, not what it held: surrogates fitted again into the same directory
    resumed the eval, mixing rows scored by two surrogates. Their content is compared now, naming the checkpoint."""
    import torch

    from eval.__main__ import fingerprint
    from eval.results import check_fingerprint
    from zoomr.kvzap.surrogate import new_surrogate
    from zoomr.paths import MissingInput

    surrogates, run_dir = tmp_path / "kvzap", tmp_path / "run"
    cfg = _cfg(run_dir, tmp_path, "+method=kvzap", f"method.surrogate_dir={surrogates}")
    with pytest.raises(MissingInput, match=f"no surrogate checkpoint at {surrogates / 'mlp'}"):
        fingerprint(cfg)  # before a fingerprint without the surrogate's digest is written
    torch.manual_seed(0)
    new_surrogate(8, 2, 2, 4).save_pretrained(surrogates / "mlp")
    (surrogates / "mlp" / "fitted_by.json").write_text('{"run_dir": "a"}')
    check_fingerprint(run_dir, fingerprint(cfg))
    (surrogates / "mlp" / "fitted_by.json").write_text('{"run_dir": "b"}')  # the weights decide, not the record
    check_fingerprint(run_dir, fingerprint(cfg))
    new_surrogate(8, 2, 2, 4).save_pretrained(surrogates / "mlp")  # fitted again: other weights
    with pytest.raises(SystemExit, match=f"method.served_surrogate: was '{surrogates / 'mlp'}, sha256 [0-9a-f]{{16}}', "
                                         f"now '{surrogates / 'mlp'}, sha256 [0-9a-f]{{16}}'"):  # fmt: skip
        check_fingerprint(run_dir, fingerprint(cfg))
    # a fingerprint written before the surrogate's digest was in it: resumed as before, the digest recorded from now on
    old = json.loads((run_dir / FINGERPRINT_FILE).read_text())
    del old["method"]["served_surrogate"]
    (run_dir / FINGERPRINT_FILE).write_text(json.dumps(old))
    check_fingerprint(run_dir, fingerprint(cfg))
    assert json.loads((run_dir / FINGERPRINT_FILE).read_text())["method"]["served_surrogate"].startswith(str(surrogates))


def test_a_torn_fingerprint_is_named_with_what_to_do(tmp_path):
    """``fingerprint.json`` was written in place, so a kill could tear it, and the next run died in a
    JSONDecodeError traceback on every rerun of the directory."""
    from eval.results import check_fingerprint
    from zoomr.jsonl import BadRowError

    check_fingerprint(tmp_path, {"model": "m"})  # written through a temporary file and a rename
    assert json.loads((tmp_path / FINGERPRINT_FILE).read_text()) == {"model": "m"}
    assert [p.name for p in tmp_path.iterdir()] == [FINGERPRINT_FILE]
    (tmp_path / FINGERPRINT_FILE).write_text('{"model": ')
    with pytest.raises(BadRowError, match=f"{FINGERPRINT_FILE}: not valid JSON .* cannot be matched to their settings"):
        check_fingerprint(tmp_path, {"model": "m"})


def test_every_masked_training_field_is_training_only_and_every_listed_field_exists():
    import dataclasses

    from zoomr.cache.registry import registered
    from zoomr.schemas.abridge import MaskedTraining

    assert set(MaskedTraining.TRAINING_ONLY) == {f.name for f in dataclasses.fields(MaskedTraining)}
    for name, config in registered().items():
        fields = {f.name for f in dataclasses.fields(config)}
        assert set(getattr(config, "TRAINING_ONLY", ())) <= fields - {"name", "policy"}, name


def test_rkv_similarity_threshold_is_range_checked():
    for bad in (1.01, -1.5, float("nan")):
        with pytest.raises(ValueError, match="similarity_threshold"):
            policy_config({"policy": "rkv", "similarity_threshold": bad})
    assert policy_config({"policy": "rkv", "similarity_threshold": 1.0}).similarity_threshold == 1.0


@pytest.mark.parametrize("n, warned", [(1, False), (3, True)])
def test_greedy_decoding_of_several_samples_is_warned_about(tmp_path, cache_dir, caplog, n, warned):
    """T = 0 with n_samples > 1 decoded identical samples without a word (the default n_samples is 2): a warning
    says so, and the run is not refused (the settings are valid)."""
    with caplog.at_level("WARNING", logger="eval.settings"):
        validate(_cfg(tmp_path / "run", cache_dir, f"generation.n_samples={n}"))
    assert ("greedy samples are identical" in caplog.text) is warned
    assert ("2 of every 3 decodes" in caplog.text) is warned


def test_method_overrides_are_the_method_fields_given_on_the_command_line():
    from hydra.core.hydra_config import HydraConfig

    from eval.__main__ import method_overrides

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("eval", overrides=["+method=abridge", "method.quota=2", "++method.schedule=null",
                                         "generation.max_new_tokens=4"], return_hydra_config=True)  # fmt: skip
    HydraConfig.instance().set_config(cfg)
    try:
        assert method_overrides() == {"quota", "schedule"}  # not +method= itself, nor other groups' keys
    finally:
        HydraConfig.instance().cfg = None
