"""Numeric settings out of range are refused when the config is read, naming the field (zoomr/schemas/checks.py)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zoomr.cache.abridge import AbridgeMethod
from zoomr.cache.kvzip import KVzipConfig
from zoomr.cache.lightthinker import LightThinkerMethod
from zoomr.models import ModelSpec
from zoomr.schemas.abridge import AbridgeAllocateMethod, AbridgeOptim
from zoomr.schemas.analysis import MiniatureTask
from zoomr.schemas.checks import BETA, POSITIVE, SettingsError, check_fields
from zoomr.schemas.kvzap import KVzapFit, KVzapPairsPipeline, TextSource
from zoomr.schemas.sft import LoraSettings, SFTMethod, TracesData
from zoomr.schemas.testbed import CurriculumSettings, TestbedData, TestbedTrainMethod
from zoomr.schemas.zoomr import SummarizePipeline

REPO = Path(__file__).resolve().parents[1]

BAD = [
    (AbridgeOptim, "learning_rate", -1e-4, "method.optim.learning_rate=-0.0001 (must be > 0)"),
    (AbridgeOptim, "learning_rate", math.nan, "learning_rate=nan"),
    (AbridgeOptim, "adam_beta2", 1.0, "adam_beta2=1.0 (must be in [0, 1))"),
    (AbridgeOptim, "weight_decay", -0.1, "weight_decay=-0.1 (must be >= 0)"),
    (AbridgeOptim, "final_lr_fraction", 1.5, "final_lr_fraction=1.5"),
    (AbridgeMethod, "per_device_batch_size", 0, "method.per_device_batch_size=0 (must be >= 1)"),
    (AbridgeMethod, "gradient_accumulation_steps", 0, "gradient_accumulation_steps=0"),
    (AbridgeMethod, "eval_steps", -1, "eval_steps=-1 (must be >= 0)"),
    (AbridgeMethod, "heldout_examples", 0, "method.heldout_examples=0 (must be >= 1)"),  # a held-out CE of 0
    (LightThinkerMethod, "heldout_examples", 0, "method.heldout_examples=0 (must be >= 1)"),  # crashed after training
    (AbridgeMethod, "logging_steps", 0, "logging_steps=0"),
    (AbridgeMethod, "mask_backend", "cuda", "mask_backend must be auto|dense|flex|chunked"),
    (AbridgeMethod, "num_pause", 0, "method: num_pause must be in [1, 256], got 0"),
    (AbridgeMethod, "code_positions", "middle", "method: code_positions must be one of"),
    (AbridgeMethod, "quota", 17, "method.quota=17 must lie in [0, method.num_pause=16]"),
    (AbridgeAllocateMethod, "batch_size", 0, "method.batch_size=0"),
    (AbridgeAllocateMethod, "mask_backend", "sparse", "mask_backend must be auto|dense|flex|chunked"),
    (MiniatureTask, "arm_lanes", 0, "arm_lanes=0"),
    (MiniatureTask, "n_resamples", 0, "n_resamples=0"),
    (TestbedData, "n_test", 0, "data.n_test=0 (must be >= 1)"),
    (TestbedData, "n_train", -1, "data.n_train=-1 (must be >= 1)"),
    (TestbedData, "query_age_bias", math.nan, "data.query_age_bias=nan (must be a finite number)"),
    (SFTMethod, "learning_rate", 0.0, "method.learning_rate=0.0 (must be > 0)"),
    (SFTMethod, "warmup_ratio", 2.0, "warmup_ratio=2.0 (must be in [0, 1])"),
    (SFTMethod, "max_length", 0, "max_length=0"),
    (LoraSettings, "r", 0, "method.lora.r=0"),
    (LoraSettings, "dropout", 1.0, "method.lora.dropout=1.0"),
    (TestbedTrainMethod, "max_steps", 0, "max_steps=0 trains nothing"),
    (TestbedTrainMethod, "tokens_per_step", 0, "method.tokens_per_step=0"),
    (TestbedTrainMethod, "betas", [0.9, 1.2], "method.betas=[0.9, 1.2] (must be each in [0, 1))"),
    (TestbedTrainMethod, "linear_init", "Torch", "method.linear_init must be torch|hub, got 'Torch'"),  # trained as hub
    (TestbedTrainMethod, "betas", [0.9], "AdamW takes two betas"),
    (TestbedTrainMethod, "min_lr_ratio", -0.5, "min_lr_ratio=-0.5"),
    (TestbedTrainMethod, "log_every", 0, "log_every=0"),
    (TestbedTrainMethod, "learning_rate", math.inf, "learning_rate=inf"),
    (CurriculumSettings, "grow_fraction", 1.5, "method.curriculum.grow_fraction=1.5"),
    (CurriculumSettings, "copy_block", [64, 8], "copy_block=[64, 8]: must be a range"),
    (CurriculumSettings, "recall_facts", [0, 4], "recall_facts=[0, 4] (must be each >= 1)"),
    (TracesData, "eval_fraction", 1.0, "data.eval_fraction=1.0 (must be in [0, 1)"),
    (TracesData, "max_samples", 0, "data.max_samples=0 (must be >= 1)"),
    (TracesData, "format", "csv", "data.format must be one of"),
    (TracesData, "source", "ftp", "data.source must be local or hub"),
    (SummarizePipeline, "max_rows", 0, "pipeline.max_rows=0 (must be >= 1)"),
    (SummarizePipeline, "min_paragraph_chars", -5, "pipeline.min_paragraph_chars=-5"),
    (KVzapPairsPipeline, "tokens_per_doc", 0, "pipeline.tokens_per_doc=0 (must be >= 1)"),
    (KVzapPairsPipeline, "chunk_size", 0, "pipeline.chunk_size=0"),
    (KVzapPairsPipeline, "docs_per_shard", 0, "pipeline.docs_per_shard=0"),
    (KVzapPairsPipeline, "min_tokens", 2000, "min_tokens=2000 > max_tokens=1250"),
    (KVzapPairsPipeline, "store_dtype", "int3", "store_dtype must be float32|bfloat16|float16"),
    (TextSource, "format", "csv", "pipeline.sources[web].format must be jsonl"),
    (TextSource, "fields", [], "a jsonl source needs fields"),
    (KVzapFit, "lr", 0.0, "method.fit.lr=0.0"),
    (KVzapFit, "epochs", 0, "method.fit.epochs=0"),
    (KVzapFit, "models", ["ridge"], "give one or both of linear, mlp"),
    (KVzapFit, "target", "kvzip+", "kvzip_plus|kvzip"),
    (AbridgeMethod, "page_size", 0, "method.page_size=0 (must be >= 1)"),
    (AbridgeMethod, "testbed_eval_problems", -1, "method.testbed_eval_problems=-1 (must be >= 0)"),
    (LightThinkerMethod, "page_size", 0, "method.page_size=0 (must be >= 1)"),
    (LightThinkerMethod, "num_cache_tokens", 0, "method.num_cache_tokens=0 (must be >= 1)"),
    (LightThinkerMethod, "min_thought_chars", -1, "method.min_thought_chars=-1 (must be >= 0)"),
    (KVzipConfig, "chunk_size", 0, "method.chunk_size=0 (must be >= 1)"),
    (KVzipConfig, "window", -1, "method.window=-1 (must be >= 0)"),
    (KVzipConfig, "n_sink", -1, "method.n_sink=-1 (must be >= 0)"),
    (KVzipConfig, "threshold", math.nan, "threshold is NaN"),
]


@pytest.mark.parametrize("schema,name,value,message", BAD, ids=[f"{s.__name__}.{n}={v}" for s, n, v, _ in BAD])
def test_an_out_of_range_setting_is_refused_naming_the_field(schema, name, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        schema(**{name: value})


@pytest.mark.parametrize("schema", sorted({s for s, *_ in BAD}, key=lambda s: s.__name__))
def test_the_defaults_pass(schema):
    schema()


def test_a_model_naming_its_own_tokenizer_or_checkpoint_needs_no_bpe_vocabulary_size():
    """``vocab_size`` sizes the BPE a tiny model trains; it is not read for a checkpoint or a named tokenizer."""
    assert ModelSpec(name="m", hf_id="some/checkpoint", vocab_size=0).vocab_size == 0
    ModelSpec(name="m", tiny={}, vocab_size=0, extra={"tokenizer": "zoomr.testbed.vocab:build_tokenizer"})
    with pytest.raises(SettingsError, match="vocab_size=100 must be >= 256"):  # printed as "invalid settings: …"
        ModelSpec(name="m", tiny={}, vocab_size=100)
    with pytest.raises(SettingsError, match="dtype 'float99' not in"):
        ModelSpec(name="m", tiny={}, dtype="float99")


def test_zero_held_out_evaluation_steps_means_none():
    assert AbridgeMethod(eval_steps=0).eval_steps == 0  # README: method.eval_steps=0 (no evaluation)


def test_every_bad_field_is_named_in_one_message_and_none_is_left_unset():
    class Settings:
        lr, beta, unset, flag = -1.0, 0.5, None, True

    with pytest.raises(ValueError) as err:
        check_fields(Settings(), "x", lr=POSITIVE, beta=BETA, unset=POSITIVE, flag=POSITIVE)
    assert "x.lr=-1.0 (must be > 0)" in str(err.value) and "x.flag=True" in str(err.value)  # a bool is no number
    assert "beta" not in str(err.value) and "unset" not in str(err.value)


def test_the_cli_refuses_a_negative_learning_rate_before_writing_the_run(tmp_path):
    """The real entry point: it fails with the field's name and leaves no run state (no settings, no checkpoints)."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "train", "+method=abridge", "method.optim.learning_rate=-1", "logger=none",
         f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "invalid settings: AbridgeOptim: method.optim.learning_rate=-1.0 (must be > 0)" in proc.stderr
    assert "Traceback" not in proc.stderr  # a setting the schema refuses is a message, not a crash
    assert not (run_dir / "settings.json").exists() and not (run_dir / "checkpoints").exists()


def test_to_dataclass_raises_a_settings_error_that_is_still_a_value_error():
    """Entry points print a SettingsError's message (no traceback); library callers keep catching ValueError."""
    from zoomr.schemas import to_dataclass
    from zoomr.schemas.checks import SettingsError

    with pytest.raises(SettingsError, match=r"unknown keys \['lr'\]"):
        to_dataclass(AbridgeOptim, {"lr": 1e-3})
    with pytest.raises(SettingsError, match="method.optim.learning_rate=0"):
        to_dataclass(AbridgeMethod, {"optim": {"learning_rate": 0}})  # a nested schema's refusal too
    assert issubclass(SettingsError, ValueError)
    assert to_dataclass(AbridgeMethod, {"quota": 16}).quota == 16  # the bounds are inclusive


@pytest.mark.parametrize("options, message", [
    ({"test_seed": 1.5}, "data.test_seed=1.5 (must be an int)"),  # drew problems from a stream "testbed/1.5/i"
    ({"n_test": True}, "data.n_test=True (must be an int)"),  # a bool is not a count
    ({"trace_tokens": "1024"}, "data.trace_tokens='1024' (must be an int)"),
    ({"summaries": 1}, "data.summaries=1 (must be a bool)"),
    ({"query_form": 3}, "data.query_form=3 (must be a str)"),
])  # fmt: skip
def test_testbed_options_of_the_wrong_type_are_refused_by_name(options, message):
    """``benchmark.options`` is a dict Hydra does not type, and the testbed builds its data settings from it:
    ``test_seed=1.5`` was evaluated on problems of a stream of its own, exit 0."""
    from eval.testbed_task import testbed_problems
    from zoomr.schemas import to_dataclass

    with pytest.raises(ValueError) as e:
        testbed_problems({**options, "n_test": options.get("n_test", 2)})
    assert message in str(e.value)
    with pytest.raises(SettingsError, match=re.escape(f"TestbedData: {message.removeprefix('data.')}")):
        to_dataclass(TestbedData, options)  # a schema read from a config node is checked the same way
    assert TestbedData(query_age_bias=1, n_test=3).query_age_bias == 1  # an int is a float


def test_to_dataclass_checks_the_scalar_types_of_every_schema():
    from zoomr.schemas import to_dataclass

    with pytest.raises(SettingsError, match=r"AbridgeMethod: quota=8.5 \(must be an int\)"):
        to_dataclass(AbridgeMethod, {"quota": 8.5})
    assert to_dataclass(AbridgeOptim, {"learning_rate": 1}).learning_rate == 1


def test_an_optional_nested_schema_is_checked_when_the_config_is_read():
    """``pipeline.testbed`` (``TestbedPairsSource | None``) stayed a dict until the pairs were planned, so
    ``pipeline.testbed.n_train=0`` was refused only after the run directory and its config were written."""
    from zoomr.schemas import to_dataclass
    from zoomr.schemas.checks import SettingsError
    from zoomr.schemas.kvzap import TestbedPairsSource

    with pytest.raises(SettingsError, match="pipeline.testbed needs n_train, n_val >= 1, got 0"):
        to_dataclass(KVzapPairsPipeline, {"testbed": {"n_train": 0}})
    assert isinstance(to_dataclass(KVzapPairsPipeline, {"testbed": {"n_train": 3}}).testbed, TestbedPairsSource)
    assert to_dataclass(KVzapPairsPipeline, {"testbed": None}).testbed is None


@pytest.mark.parametrize("seed", [0, 7])
def test_a_test_seed_equal_to_the_training_stream_is_refused(seed):
    """Problem i of a stream is the same problem wherever it is drawn: such a test set is the training set."""
    from eval.testbed_task import testbed_problems

    with pytest.raises(ValueError, match=f"data.test_seed={seed} is the training stream's seed"):
        TestbedData(seed=seed, test_seed=seed)
    with pytest.raises(ValueError, match="would be training problems"):
        testbed_problems({"seed": seed, "test_seed": seed, "n_test": 2})
    assert len(testbed_problems({"seed": seed, "test_seed": seed + 1_000_003, "n_test": 2})) == 2


@pytest.mark.parametrize("seed,model", [(0, "abridge_c128_4to1"), (1, "abridge_c128_perlayer_boundary"), (2, "kvzap_pairs")])
def test_the_miniature_refuses_a_test_seed_any_of_its_models_trains_on(seed, model, tmp_path, capsys):
    from analysis.miniature import run_task

    with pytest.raises(ValueError, match=rf"task.test_seed={seed} is the training stream of \[.*'{model}'"):
        run_task({"arms": ["full"], "test_seed": seed, "out": str(tmp_path / "out"), "dry_run": True})
    assert "miniature:" not in capsys.readouterr().out and not (tmp_path / "out").exists()  # refused first


def test_the_miniature_refuses_an_out_path_that_is_a_file_before_any_model_trains(tmp_path, capsys):
    from analysis.miniature import run_task

    out = tmp_path / "out"
    out.write_text("not a directory")
    with pytest.raises(ValueError, match=r"task.out=.*out is a file"):
        run_task({"arms": ["full"], "out": str(out), "dry_run": True})
    assert "miniature:" not in capsys.readouterr().out and out.read_text() == "not a directory"


@pytest.mark.parametrize("line,message", [("{not json", "line 2 is not JSON"), ("[1, 2]", "line 2 is not a JSON object"),
                                          ('{"txt": "x"}', r"line 2: missing fields \['text'\] \(has \['txt'\]\)")])
def test_a_kvzap_text_source_names_its_unreadable_line(tmp_path, line, message):
    from data_prep.kvzap_pairs import load_texts

    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"source 'web': .*docs.jsonl {message}"):
        load_texts(TextSource(path=str(path)))
    path.write_text('{"text": "fine"}\n\n{"text": "also fine"}\n')
    assert load_texts(TextSource(path=str(path))) == ["fine", "also fine"]


def test_a_kvzap_text_source_that_is_not_utf8_is_named_and_printed_alone(tmp_path):
    """A missing field was a KeyError traceback, a non-UTF-8 file a UnicodeDecodeError one."""
    from data_prep.kvzap_pairs import load_texts
    from zoomr.jsonl import BadRowError

    path = tmp_path / "docs.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "\xff\xfe"}\n')
    with pytest.raises(BadRowError, match=r"docs.jsonl is not UTF-8 text \(at or after line"):
        load_texts(TextSource(path=str(path)))


@pytest.mark.parametrize("method", ["abridge", "lightthinker"])
def test_a_masked_training_start_that_is_not_a_checkpoint_is_named(method, tmp_path):
    """It said the hub was unreachable and to set model.hf_id, which the user had not touched."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "train", f"+method={method}", f"method.init_from={tmp_path / 'nope'}", "logger=none",
         f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0 and "not a checkpoint directory (no config.json" in proc.stderr
    assert not (run_dir / "settings.json").exists()


@pytest.mark.parametrize("method", ["sft", "abridge", "lightthinker"])
def test_a_missing_local_data_file_is_named_before_any_run_state(method, tmp_path):
    """``+method=sft data.path=<typo>`` wrote ``settings.json`` and ``config.json`` and then died in the loader
    with a traceback; now the trainers check the file before the run directory guard writes anything."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "train", f"+method={method}", "data=traces", f"data.path={tmp_path / 'typo.jsonl'}",
         "logger=none", f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and f"data.path={tmp_path / 'typo.jsonl'}: no such file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "settings.json").exists() and not (run_dir / "config.json").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+method=sft_testbed", "data=testbed", "model=tiny-testbed", "data.trace_tokens=10"], "too short for one paragraph"),
        (["+method=sft_testbed", "data=testbed", "model=tiny-qwen2"], "the model's tokenizer lacks 359 testbed words"),
        (["+method=abridge", "model=tiny-qwen2"], "the model's tokenizer lacks 359 testbed words"),  # KeyError: 'user'
        (["+method=sft_testbed", "data=testbed", "model=tiny-testbed", "method.init_from=/nonexistent/final"],
         "method.init_from=/nonexistent/final: no such directory"),  # a ValueError traceback
        (["+method=sft_testbed", "data=testbed_summaries", "model=tiny-testbed", "method.summary_pointer_layers=[7]"],
         "invalid settings: method.summary_pointer_layers=[7]: the model has layers 0..2"),  # after config.json
        (["+method=sft_testbed", "data=testbed", "model=tiny-testbed", "method.value_read_weight=1"],
         "invalid settings: method.value_read_weight=1.0: > 0 needs data with summaries"),  # a ValueError traceback
        (["+method=sft", "data.format=bogus"], "invalid settings: data.format must be one of"),  # the loader's traceback
        (["+method=sft", "data.eval_fraction=1.5"], "data.eval_fraction=1.5 (must be in [0, 1)"),  # Hydra skips __post_init__
        (["+method=abridge", "method.max_response_tokens=100"], "max_response_tokens=100 would cut them"),
        (["+method=abridge", "method.block_size=4096"], "no response completes a block"),  # trained as full KV
        (["+method=lightthinker", "data=testbed", "method.init_from=analysis/results/miniature/base_model",
          "method.max_response_tokens=512"], "max_response_tokens=512 would cut them"),
    ],
)  # fmt: skip
def test_data_a_trainer_cannot_use_is_refused_before_any_run_state(overrides, message, tmp_path):
    """These failed only after ``settings.json`` and ``config.json`` (LightThinker: also ``lightthinker.json``) were
    written: the testbed trainer checked its tokenizer and trace length, AbridgeKV and LightThinker their data,
    after the run directory guard."""
    assert message in train_refused(overrides, tmp_path / "run")


def train_refused(overrides: list[str], run_dir: Path) -> str:
    """``python -m train <overrides>`` with ``run_dir``, in this process: the entry point's own function on the
    composed config (Hydra's passthrough: the same checks, the same error handling, without a new interpreter);
    asserts it refuses with a message (SystemExit; any other exception is a crash and fails the test) and writes no
    run state; returns the message. :func:`train_refused_cli` runs the real command where its output matters."""
    from hydra import compose, initialize_config_dir

    from train.__main__ import main
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, "logger=none", f"run_dir={run_dir}", "hydra.runtime.output_dir=."])
    with pytest.raises(SystemExit) as stop:
        main(cfg)
    assert isinstance(stop.value.code, str), stop.value.code  # a message, not a bare exit status
    assert not run_dir.exists()
    return stop.value.code


def train_refused_cli(overrides: list[str], run_dir: Path) -> str:
    """``python -m train <overrides>`` in ``run_dir``: asserts it exits 1 with a message, no traceback and no run
    state (the directory Hydra made for it is removed again); returns its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "train", *overrides, "logger=none", f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-1500:]  # a message, not a crash
    assert not run_dir.exists()
    return proc.stderr


def test_a_torn_pairs_manifest_is_printed_alone_before_any_run_state(tmp_path):
    """A malformed input file (:class:`zoomr.jsonl.BadRowError`) came out of every entry point as a traceback."""
    (tmp_path / "pairs").mkdir()
    (tmp_path / "pairs" / "manifest.json").write_text('{"format":')
    stderr = train_refused_cli(["+method=kvzap", f"method.pairs_dir={tmp_path / 'pairs'}"], tmp_path / "run")
    assert "manifest.json: not valid JSON (expected a JSON KVzap pairs manifest" in stderr


def test_a_schedule_for_another_depth_is_refused_by_name_before_any_run_state(tmp_path):
    """The quota schedule is checked against the loaded model's layers: ``quota schedule has 2 entries for a model
    with 3 layers`` came as a ValueError traceback."""
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"quotas": [64, 64]}))
    stderr = train_refused(["+method=abridge", f"method.schedule={schedule}"], tmp_path / "run")
    assert f"invalid settings: method.schedule={schedule} / method.quota=None: quota schedule has 2 entries" in stderr


NO_CUDA = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="these settings train on a CUDA machine")
NO_DEEPSPEED = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("deepspeed") is not None, reason="deepspeed is installed"
)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(["+method=abridge", "method.bf16=true"], "invalid settings: the trainer refuses these settings: "
                     "Your setup doesn't support bf16", marks=NO_CUDA),
        pytest.param(["+method=abridge", "method.mask_backend=flex"], "invalid settings: method.mask_backend=flex "
                     "trains on CUDA only", marks=NO_CUDA),
        pytest.param(["+method=lightthinker", "data.max_samples=8", "deepspeed=zero2"],
                     "deepspeed=zero2|zero3: pip install -e '.[deepspeed]'", marks=NO_DEEPSPEED),
    ],
)  # fmt: skip
def test_loop_settings_the_trainer_refuses_are_named_before_any_run_state(overrides, message, tmp_path):
    """The masked trainers built their ``TrainingArguments`` after ``settings.json``, ``config.json`` and
    ``abridge.json``: bf16 on a CPU and a missing deepspeed were tracebacks there, and the flex mask a
    ``NotImplementedError`` traceback at the first step, after ``checkpoints/``."""
    assert message in train_refused(overrides, tmp_path / "run")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["method.max_length=8"], "invalid settings: method.max_length=8: every one of the 6 rows' prompts"),
        (["method.lr_scheduler=bogus"], "the trainer refuses these settings: bogus is not a valid SchedulerType"),
        (["method.lora.target_modules=[q_proj,qproj]"], "method.lora.target_modules: ['qproj'] name no module"),
        (["data.eval_fraction=0.99"], "invalid settings: data.eval_fraction=0.99 holds out all 6 rows"),
        pytest.param(["method.bf16=true"], "Your setup doesn't support bf16", marks=NO_CUDA),
    ],
)  # fmt: skip
def test_sft_settings_the_trainer_refuses_are_named_before_any_run_state(overrides, message, tmp_path):
    """``+method=sft`` wrote ``config.json`` and ``settings.json`` (and ``checkpoints/``) before it loaded the model
    and the data or built TRL's arguments: each of these was a traceback after them (``max_length`` below every
    prompt: ``num_samples=0`` in the sampler; a misspelt LoRA target beside a good one was skipped silently)."""
    assert message in train_refused(["+method=sft", "data.max_samples=6", *overrides], tmp_path / "run")


GOOD_MANIFEST = {
    "format": "zoomr-kvzap-pairs/1", "model": {"name": "tiny-qwen2", "layers": 4, "hidden": 256, "kv_heads": 2},
    "n_pairs": {"train": 10, "val": 5},
    "shards": [{"file": "shard-train-00000.safetensors", "split": "train"},
               {"file": "shard-val-00000.safetensors", "split": "val"}],
}  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"format": "other"}, "format 'other', expected 'zoomr-kvzap-pairs/1'"),  # a ValueError traceback
        ({"model": None}, "'model' must name the model and its integer layers"),  # KeyError: 'model'
        ({"n_pairs": {"train": 10}}, "'n_pairs' must count the train and val pairs"),  # KeyError after the fit
        ({"shards": GOOD_MANIFEST["shards"][:1]}, "no 'val' shard listed"),  # ValueError after settings.json
    ],
)
def test_a_pairs_manifest_the_fit_cannot_read_is_named_before_any_run_state(edit, message, tmp_path):
    """An edited or foreign KVzap pairs manifest was a KeyError / ValueError traceback (a split without shards
    only after the fit's ``config.json`` and ``settings.json``); now a BadRowError naming the file."""
    (tmp_path / "pairs").mkdir()
    (tmp_path / "pairs" / "manifest.json").write_text(json.dumps(GOOD_MANIFEST | edit))
    stderr = train_refused(["+method=kvzap", f"method.pairs_dir={tmp_path / 'pairs'}"], tmp_path / "run")
    assert f"{tmp_path / 'pairs' / 'manifest.json'}: " in stderr and message in stderr


def test_lightthinker_data_where_no_thought_ends_is_refused_before_any_run_state(tmp_path):
    """A ``method.max_response_tokens`` that cuts every response before its first thought ends trained plain
    full-KV attention (0 thoughts, no cache token) and finished with exit 0, as AbridgeKV's too-large block did."""
    stderr = train_refused(["+method=lightthinker", "data.max_samples=6", "method.max_response_tokens=5"], tmp_path / "run")
    assert "no thought ends within method.max_response_tokens=5" in stderr


def test_lightthinker_cache_tokens_as_many_as_a_thought_are_refused_before_any_run_state(tmp_path):
    """``method.num_cache_tokens=1000`` was accepted: every thought grew by 1,000 rows instead of shrinking, a run
    without end; a count not below the data's mean thought is refused, naming both."""
    stderr = train_refused(["+method=lightthinker", "data.max_samples=6", "method.num_cache_tokens=1000"], tmp_path / "run")
    assert "method.num_cache_tokens=1000 is not below the mean thought" in stderr and "nothing would be saved" in stderr


@pytest.mark.parametrize("method", ["abridge", "lightthinker"])
def test_an_eval_fraction_the_masked_trainers_ignore_is_refused(method, tmp_path):
    """``data.eval_fraction=0.5`` is TRL SFT's held-out split; AbridgeKV and LightThinker hold out
    ``method.heldout_examples`` and trained on every row asked to be held out, exit 0."""
    stderr = train_refused([f"+method={method}", "model=tiny-qwen2", "data=traces", "data.eval_fraction=0.5",
                            "method.max_steps=1", "method.testbed_eval_problems=0" if method == "abridge" else "method.save_steps=1"],
                           tmp_path / "run")  # fmt: skip
    assert "invalid settings: data.eval_fraction=0.5: this trainer holds out the first method.heldout_examples" in stderr


@pytest.mark.parametrize("method", ["kvzap", "sft_testbed", "abridge_allocate"])
def test_deepspeed_with_a_recipe_that_does_not_run_it_is_refused(method, tmp_path):
    """``deepspeed=zero2`` with the KVzap fit, the testbed trainer or the AbridgeKV allocation (their own loops, not
    the HF Trainer) was accepted and not used: one process without ZeRO, while config.json said zero2."""
    message = train_refused([f"+method={method}", "deepspeed=zero2"], tmp_path / "run")
    assert f"deepspeed=zero2 would be ignored: +method={method} trains in its own loop" in message


def test_the_testbed_trainer_refuses_a_device_or_attention_it_would_not_use_before_any_run_state(tmp_path, monkeypatch):
    """``+method=sft_testbed device=cuda`` (on a GPU machine) trained on the CPU without a word (its model stays where
    load_model puts it); ``model.attn_implementation=bogus`` failed after config.json, when the model loaded."""
    testbed = ["+method=sft_testbed", "data=testbed", "model=tiny-testbed"]
    message = train_refused([*testbed, "model.attn_implementation=bogus"], tmp_path / "a")
    assert "model.attn_implementation=bogus: not one of eager" in message
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # a machine with one GPU, as far as device= is checked
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    message = train_refused([*testbed, "device=cuda"], tmp_path / "b")
    assert "device=cuda: the testbed trainer (+method=sft_testbed) trains on the CPU" in message


@pytest.mark.parametrize("device", ["cpu", "cuda:1"])
@pytest.mark.parametrize("method", ["sft", "abridge"])
def test_a_device_the_hf_trainer_would_not_train_on_is_refused(method, device, tmp_path, monkeypatch):
    """On a GPU machine the HF Trainer recipes train on the GPU (cuda:0) whatever ``device=`` said: ``device=cpu``
    trained on the GPU and ``device=cuda:1`` on cuda:0, without a word, config.json naming the device asked for."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # a machine with two GPUs, as far as device= is checked
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    message = train_refused([f"+method={method}", f"device={device}"], tmp_path / "run")
    assert message.startswith(f"device={device}: +method={method} trains with the HF Trainer")
    assert "CUDA_VISIBLE_DEVICES=" in message
