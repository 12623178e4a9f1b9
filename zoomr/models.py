"""Model and tokenizer loading: real hub checkpoints and tiny models built from configs.

A tiny model (``tiny-qwen2``, ``tiny-llama``, ``tiny-qwen3``, …) is built once from a config with
random weights and the locally trained tokenizer, written with ``save_pretrained`` into a cache
directory, and from then on loaded with the ordinary ``from_pretrained``: the loading path users run
with real checkpoints is the one tests exercise.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from zoomr.jsonl import read_json_object
from zoomr.named_tokenizer import builder_version, named_tokenizer_dir, tokenizer_builder
from zoomr.paths import MissingInput
from zoomr.schemas.checks import SettingsError
from zoomr.tokenizer import TOKENIZER_VERSION, train_bpe_tokenizer

log = logging.getLogger(__name__)

ARCHITECTURES = ("qwen2", "llama", "qwen3", "phi3")  # phi3: partial RoPE (``partial_rotary_factor``)
BYTE_ALPHABET = 256  # byte-level BPE: the smallest vocabulary a tiny model's tokenizer can have
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSpec:
    """What to load: ``hf_id`` (a hub id or a local directory: a saved model or a PEFT adapter) or ``tiny``.

    ``tiny`` holds config overrides for a randomly initialised model of architecture ``arch``. A given
    ``hf_id`` wins: ``model=tiny-qwen2 model.hf_id=<checkpoint>`` loads the checkpoint (the tiny overrides
    only described how its base was built), so no ``model.tiny=null`` is needed.
    """

    name: str
    arch: str = "qwen2"
    hf_id: str | None = None
    tiny: dict[str, Any] | None = None
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    vocab_size: int = 4096  # tiny models: size of the locally trained BPE vocabulary (before special tokens)
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hf_id is None and self.tiny is None:
            raise SettingsError(
                f"model {self.name!r}: set model.hf_id (a hub id or a checkpoint directory) or model.tiny "
                "(the overrides of a tiny model, e.g. model=tiny-qwen2)"
            )
        if self.hf_id is not None and self.tiny is not None:
            self.tiny = None  # a checkpoint given on top of a tiny model config: load the checkpoint
        if self.arch not in ARCHITECTURES:
            raise SettingsError(f"model {self.name!r}: arch {self.arch!r} not in {ARCHITECTURES}")
        if self.dtype not in DTYPES:
            raise SettingsError(f"model {self.name!r}: dtype {self.dtype!r} not in {sorted(DTYPES)}")
        unknown = sorted(set(self.tiny or {}) - tiny_keys(self.arch))
        if unknown:  # transformers keeps any keyword as an attribute nobody reads: the model was built without it
            raise SettingsError(f"model {self.name!r}: model.tiny has keys no {self.arch} config reads: {unknown}")
        bpe = self.hf_id is None and not (self.extra or {}).get("tokenizer")  # a locally trained BPE tokenizer
        if bpe and not (isinstance(self.vocab_size, int) and self.vocab_size >= BYTE_ALPHABET):
            raise SettingsError(f"model {self.name!r}: vocab_size={self.vocab_size} must be >= {BYTE_ALPHABET} "
                                "(the byte-level BPE's alphabet; the tokenizer is trained to this size)")  # fmt: skip

    @property
    def is_tiny(self) -> bool:
        return self.tiny is not None


def tiny_keys(arch: str) -> set[str]:
    """The ``model.tiny`` keys a tiny model of ``arch`` uses: its config class's fields, ``head_dim`` (every
    supported attention reads it when set) and what :func:`tiny_config` turns into RoPE parameters."""
    import inspect

    config = AutoConfig.for_model(arch)
    fields = set(config.to_dict()) | (set(inspect.signature(type(config).__init__).parameters) - {"self", "kwargs"})
    return fields | {"head_dim", "rope_theta", "partial_rotary_factor"}


TINY_SIZE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2}


def tiny_spec(arch: str = "qwen2", **tiny_overrides: Any) -> ModelSpec:
    """The tiny default model of ``arch`` (4 layers, hidden 256, 4/2 heads), with config overrides."""
    return ModelSpec(name=f"tiny-{arch}", arch=arch, tiny={**TINY_SIZE, **tiny_overrides})


def default_cache_dir() -> Path:
    return Path(os.environ.get("ZOOMR_CACHE", Path.home() / ".cache" / "zoomr"))


def tiny_config(arch: str, vocab_size: int, **overrides: Any):
    """A transformers config of the same class as the real models, small enough for a CPU."""
    base = dict(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )
    if arch == "qwen3":
        base["head_dim"] = 64
    base.update(copy.deepcopy(overrides))  # the config class fills rope_parameters in place: never the caller's spec
    heads, kv = base["num_attention_heads"], base["num_key_value_heads"]
    if not all(isinstance(n, int) and n >= 1 for n in (heads, kv)):  # kv = 0 was a ZeroDivisionError here
        raise SettingsError(f"tiny {arch}: num_attention_heads={heads!r} and num_key_value_heads={kv!r} must be ints >= 1")
    theta, factor = base["rope_theta"], base.get("partial_rotary_factor", 1.0)
    if not (isinstance(theta, int | float) and theta > 0):  # 0 or below built a model whose positions mean nothing
        raise SettingsError(f"tiny {arch}: rope_theta={theta!r} must be > 0")
    if not (isinstance(factor, int | float) and 0 <= factor <= 1):  # above 1: a shape error in the first forward
        raise SettingsError(f"tiny {arch}: partial_rotary_factor={factor!r} must be in [0, 1] (the share of each head's dims)")
    if heads % kv or heads // kv < 2:  # a ValueError was a traceback at the entry points (SettingsError: the message)
        raise SettingsError(f"tiny {arch}: need GQA with >= 2 query heads per KV head, got num_attention_heads={heads} / "
                            f"num_key_value_heads={kv}")  # fmt: skip
    # model.tiny.rope_parameters (e.g. linear scaling) on top: the assignment below replaced it without a word
    rope = {"rope_type": "default", "rope_theta": base.pop("rope_theta"), **(base.get("rope_parameters") or {})}
    if "partial_rotary_factor" in base:  # RoPE on the first fraction of each head's dims, none on the rest
        if arch != "phi3":
            raise SettingsError(f"tiny {arch}: partial_rotary_factor needs arch phi3 (llama/qwen rotate every dim)")
        rope["partial_rotary_factor"] = base.pop("partial_rotary_factor")
    config = _rope_checked_config(arch, base, base.get("rope_parameters") or {})
    config.rope_parameters = rope  # transformers 5 keeps RoPE settings in rope_parameters
    return config


def _rope_checked_config(arch: str, base: dict[str, Any], given: dict[str, Any]):
    """``AutoConfig.for_model(arch, **base)``, refusing ``model.tiny.rope_parameters`` (``given``) transformers would
    not build as given (``SettingsError``): an unknown ``rope_type`` or one missing a required key was a ``KeyError``
    traceback after the tokenizer was trained, and a key the type does not read (``{factor: 4}`` without
    ``rope_type: linear``) built an unscaled model with a logged warning."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = given.get("rope_type", "default")
    if kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
        raise SettingsError(f"tiny {arch}: rope_parameters.rope_type={kind!r} is not one of "
                            f"{['default', *sorted(ROPE_INIT_FUNCTIONS)]}")  # fmt: skip
    unread: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: unread.append(record.getMessage()) if "Unrecognized keys" in record.getMessage() else None
    rope_log = logging.getLogger("transformers.modeling_rope_utils")
    rope_log.addHandler(handler)
    try:
        config = AutoConfig.for_model(arch, **base)
    except KeyError as e:  # a required key missing
        if "rope_parameters" not in str(e):
            raise
        raise SettingsError(f"tiny {arch}: rope_parameters={given}: {str(e).strip(chr(34))}") from None
    finally:
        rope_log.removeHandler(handler)
    if unread and given:
        raise SettingsError(f"tiny {arch}: rope_parameters={given}: {unread[0]} (no RoPE of this type reads them)")
    return config


def _tiny_dir(spec: ModelSpec, cache_dir: Path) -> Path:
    key_fields = {"arch": spec.arch, "tiny": spec.tiny, "vocab": spec.vocab_size, "seed": spec.seed, "tok": TOKENIZER_VERSION}
    if builder := tokenizer_builder(spec.extra):  # a model naming its own tokenizer (extra.tokenizer)
        key_fields["tok"] = builder_version(builder)
    key = json.dumps(key_fields, sort_keys=True)
    return cache_dir / "tiny" / f"{spec.name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def load_tokenizer_dir(cache_dir: Path, vocab_size: int) -> Path:
    """Train (once) and save the local BPE tokenizer; return its directory."""
    path = cache_dir / "tokenizers" / f"{TOKENIZER_VERSION}-{vocab_size}"
    if not (path / "tokenizer.json").exists():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tok = train_bpe_tokenizer(vocab_size)
        tok.save_pretrained(tmp)
        tmp.rename(path) if not path.exists() else None
    return path


def _cached_config_differs(spec: ModelSpec, out: Path) -> str | None:
    """How the tiny model cached at ``out`` differs from what ``spec`` builds now (None: it does not), in the RoPE
    parameters and every field the spec sets. The directory is named by the spec, not by what was built from it: a
    model built before ``model.tiny.rope_parameters`` was applied (4cab432) is cached unscaled under a scaled spec."""
    try:
        cached = AutoConfig.from_pretrained(out).to_dict()
    except (OSError, ValueError) as e:
        return f"an unreadable config.json ({e.__class__.__name__})"
    expected = tiny_config(spec.arch, vocab_size=cached.get("vocab_size", spec.vocab_size), **(spec.tiny or {})).to_dict()
    rope = {"rope_theta", "rope_parameters", "partial_rotary_factor"}
    keys = {"rope_parameters"} | {k for k in spec.tiny or {} if k not in rope}
    differ = [f"{k}={cached.get(k)!r} where the spec gives {expected.get(k)!r}" for k in sorted(keys)
              if cached.get(k) != expected.get(k)]  # fmt: skip
    return "; ".join(differ) or None


def build_tiny(spec: ModelSpec, cache_dir: Path | None = None) -> Path:
    """Build the tiny model and tokenizer into the cache (once); return the directory. A cached model whose config
    differs from the spec's (:func:`_cached_config_differs`) is built again in its place, with a warning."""
    cache_dir = Path(cache_dir or default_cache_dir())
    out = _tiny_dir(spec, cache_dir)
    stale = None
    if (out / "config.json").exists():
        stale = _cached_config_differs(spec, out)
        if stale is None:
            return out
        log.warning("tiny model %s in the cache was built with %s (by an earlier version); building it again", out, stale)
    builder = tokenizer_builder(spec.extra)
    tok_dir = named_tokenizer_dir(builder, cache_dir) if builder else load_tokenizer_dir(cache_dir, spec.vocab_size)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    config = tiny_config(spec.arch, vocab_size=len(tok), **(spec.tiny or {}))
    config.pad_token_id = tok.pad_token_id
    config.eos_token_id = tok.eos_token_id
    config.bos_token_id = None
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if stale is not None and out.exists() and _cached_config_differs(spec, out) is not None:  # not yet replaced
        old = out.with_name(out.name + f".stale{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    if not out.exists():
        tmp.rename(out)
    log.info("built tiny model %s at %s", spec.name, out)
    return out


def resolve_model_path(spec: ModelSpec, cache_dir: Path | None = None) -> str:
    """Local directory or hub id that ``from_pretrained`` should read; a ``hf_id`` that names a local
    directory which is not a whole checkpoint is refused here, naming what is wrong (not blamed on the hub)."""
    if spec.is_tiny:
        return str(build_tiny(spec, cache_dir))
    problem = local_checkpoint_problem(str(spec.hf_id))
    if problem:
        raise ModelPathError(f"model.hf_id={spec.hf_id}: {problem}")
    return str(spec.hf_id)


class ModelPathError(MissingInput):
    """``model.hf_id`` names a local directory that is not a whole checkpoint (entry points print it alone)."""


def is_local_path(hf_id: str) -> bool:
    """Whether ``hf_id`` means a directory on this machine rather than a hub id (``name`` or ``owner/name``):
    it exists, starts with ``/``, ``.`` or ``~``, or has more than one ``/``."""
    return Path(hf_id).exists() or hf_id.startswith(("/", ".", "~")) or hf_id.rstrip("/").count("/") > 1


def local_checkpoint_problem(hf_id: str) -> str | None:
    """Why the local directory ``hf_id`` cannot be loaded (None: it holds a model or a PEFT adapter with whole
    weights, or ``hf_id`` is a hub id)."""
    if not is_local_path(hf_id):
        return None
    if hf_id.startswith("~"):
        return "'~' is not expanded here: give the directory's full path"
    return checkpoint_dir_problem(hf_id)


def checkpoint_dir_problem(path: str | Path) -> str | None:
    """Why the directory ``path`` is not a loadable checkpoint (None: a model or PEFT adapter with whole weights)."""
    from zoomr.rundir import weights_problems

    path = Path(path)
    if not path.exists():
        return f"no such directory ({path.absolute()})"
    if not path.is_dir():
        return "a file, not a checkpoint directory"
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        inside = sorted(p.name for p in path.iterdir())[:8]
        return f"not a checkpoint directory (no config.json or adapter_config.json; it holds {inside or 'nothing'})"
    wrong = weights_problems(path)
    return f"incomplete checkpoint: {'; '.join(wrong)}" if wrong else None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(spec: ModelSpec, cache_dir: Path | None = None):
    path = resolve_model_path(spec, cache_dir)
    local = Path(path)
    if local.is_dir() and not any((local / f).exists() for f in TOKENIZER_FILES):
        raise ModelPathError(
            f"model.hf_id={spec.hf_id}: no tokenizer in the checkpoint (none of {', '.join(TOKENIZER_FILES)}); "
            "save it beside the weights (tokenizer.save_pretrained(<dir>))"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    except OSError as e:
        raise _hub_error(spec, e) from e
    except ValueError as e:  # e.g. tokenizer_config.json without its vocabulary: "You need to have sentencepiece …"
        if not local.is_dir():
            raise
        held = ", ".join(f for f in TOKENIZER_FILES if (local / f).exists())
        raise ModelPathError(
            f"model.hf_id={spec.hf_id}: the tokenizer in the checkpoint cannot be loaded from {held} "
            f"({str(e).strip().splitlines()[0]}); save the whole tokenizer beside the weights (tokenizer.save_pretrained(<dir>))"
        ) from None
    if local.is_dir() and (problem := tokenizer_vocab_problem(local, tokenizer)):
        raise ModelPathError(f"model.hf_id={spec.hf_id}: {problem}")
    return tokenizer


def load_config(spec: ModelSpec, cache_dir: Path | None = None):
    """The model's config without its weights (a PEFT adapter: its base model's), to check settings before loading."""
    path = resolve_model_path(spec, cache_dir)
    try:
        return AutoConfig.from_pretrained(adapter_base(path) or path, trust_remote_code=spec.trust_remote_code)
    except OSError as e:
        raise _hub_error(spec, e) from e


def tokenizer_vocab_problem(path: str | Path, tokenizer) -> str | None:
    """Why ``tokenizer`` cannot be the checkpoint ``path``'s own (None: it fits, or ``path`` holds no ``config.json``,
    e.g. a PEFT adapter, whose base is grown to its tokenizer): it has more tokens than the model has embedding rows
    (a tokenizer copied from another model: its ids past the rows fail in the embedding, the others name other tokens)."""
    config = Path(path) / "config.json"
    if not config.is_file() or (Path(path) / "adapter_config.json").is_file():
        return None
    record = read_json_object(config, "model config")
    rows = record.get("vocab_size", (record.get("text_config") or {}).get("vocab_size"))
    if isinstance(rows, int) and len(tokenizer) > rows:
        return (f"its tokenizer has {len(tokenizer)} tokens, its model {rows} embedding rows (config.json vocab_size): "
                "the tokenizer belongs to another model (save the model's own tokenizer beside its weights)")
    return None


def attention_problem(name: str) -> str | None:
    """What stops the attention implementation ``name`` on this machine (None: nothing known here): a name
    transformers does not know (its ``ValueError`` traceback from ``from_pretrained``), or ``flash_attention_*``
    without a CUDA GPU (an ``ImportError`` traceback saying the package is missing, also where it is installed)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    known = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    if name.startswith("flash_attention") and not torch.cuda.is_available():
        return "FlashAttention runs on CUDA GPUs only, and this machine has none: use sdpa"
    if name not in known and name.removeprefix("paged|") not in known and "/" not in name:  # org/repo: a hub kernel
        return f"not one of {', '.join(known)}"
    return None


def check_attention(name: str) -> None:
    """:func:`attention_problem` as a :class:`SettingsError` naming ``model.attn_implementation``: called by
    :func:`load_model`, and before any run state by an entry point that loads its model after writing some."""
    if problem := attention_problem(name):
        raise SettingsError(f"model.attn_implementation={name}: {problem}")


def load_model(
    spec: ModelSpec,
    cache_dir: Path | None = None,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    dtype: str | None = None,
):
    """Load the model with ``from_pretrained`` (tiny ones from the cache), in eval mode.

    A PEFT adapter directory (``adapter_config.json``, e.g. ``+method=sft`` / ``zoomr_sft`` LoRA output) is
    loaded onto its base and merged (:func:`load_adapter_merged`): LoRA weights and trainable token rows.
    """
    attn = attn_implementation or spec.attn_implementation
    check_attention(attn)
    path = resolve_model_path(spec, cache_dir)
    kwargs = dict(dtype=DTYPES[dtype or spec.dtype], attn_implementation=attn, trust_remote_code=spec.trust_remote_code)
    try:
        if adapter_base(path) is not None:
            model = load_adapter_merged(path, **kwargs)
        else:
            model = load_matching_weights(path, strict=spec.is_tiny or is_local_path(str(spec.hf_id)), **kwargs)
    except ModelPathError:
        raise
    except ImportError as e:  # flash_attention_2 on a GPU machine without the flash-attn package (nor a kernel)
        if not attn.startswith("flash_attention"):
            raise
        raise MissingInput(f"model.attn_implementation={attn}: {str(e).strip()} (or use sdpa)") from None
    except OSError as e:
        raise _hub_error(spec, e) from e
    return model.to(device).eval()


def load_matching_weights(path: str | Path, strict: bool = True, model_class: Any = AutoModelForCausalLM, **kwargs: Any):
    """``model_class.from_pretrained(path)``, refusing (:class:`ModelPathError`) a checkpoint whose weights do not
    fit its ``config.json``: missing (randomly initialised), unexpected (ignored) or of another shape. transformers
    only prints a load report and runs the wrong model (e.g. a config with fewer layers than the weights).
    ``strict=False`` (a hub model) logs the report as a warning instead."""
    if strict:  # else transformers raises on a tensor of another shape ("look at the above report"), naming none here
        kwargs.setdefault("ignore_mismatched_sizes", True)
    model, info = model_class.from_pretrained(path, output_loading_info=True, **kwargs)
    kinds = {"missing": info.get("missing_keys"), "unexpected": info.get("unexpected_keys"),
             "of another shape": info.get("mismatched_keys")}  # fmt: skip
    wrong = [f"{len(keys)} {kind} ({', '.join(_key_text(k) for k in sorted(keys, key=str)[:3])}{', …' if len(keys) > 3 else ''})"
             for kind, keys in kinds.items() if keys]  # fmt: skip
    if wrong:
        message = f"{path}: its weights do not match its config.json: {'; '.join(wrong)}"
        if strict:
            raise ModelPathError(message + " (a config.json edited or copied from another model?)")
        log.warning(message)
    return model


def _key_text(key: Any) -> str:
    """A load report's key: a name, or (name, checkpoint shape, config shape) for a tensor of another shape."""
    if isinstance(key, tuple) and len(key) == 3:
        name, saved, wanted = key
        return f"{name}: {list(saved)} in the weights, {list(wanted)} by config.json"
    return str(key)


def adapter_base(path: str | Path) -> str | None:
    """The base model a PEFT adapter directory was trained on (None: not an adapter directory)."""
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        return None
    base = read_json_object(config, "PEFT adapter config").get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config}: no base_model_name_or_path, cannot tell which model the adapter belongs to")
    return base


def load_adapter_merged(path: str | Path, **kwargs: Any):
    """Base model + the PEFT adapter at ``path``, merged into plain weights.

    transformers' own adapter loading reports the tied head's trainable-token delta of a ``zoomr_sft``
    checkpoint as "MISSING, newly initialized" (harmless, but it reads as lost training); PEFT's loader
    restores every saved tensor, and merging leaves an ordinary model for the cache policies. The base is
    grown to the adapter's tokenizer first when training added tokens (``zoomr_sft`` delimiters).
    """
    from peft import PeftModel

    base_path = adapter_base(path)
    if not Path(base_path).exists() and Path(base_path).is_absolute():
        raise OSError(f"adapter {path} was trained on {base_path}, which is not on this machine")
    base = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
    if (Path(path) / "tokenizer_config.json").exists():
        vocab = len(AutoTokenizer.from_pretrained(path))
        if vocab > base.get_input_embeddings().weight.shape[0]:
            base.resize_token_embeddings(vocab)
    model = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
    model.config._name_or_path = str(path)  # policies look for checkpoint files (abridge.json) here
    return model


def load_model_and_tokenizer(spec: ModelSpec, cache_dir: Path | None = None, **kwargs: Any):
    return load_model(spec, cache_dir, **kwargs), load_tokenizer(spec, cache_dir)


class ModelUnavailable(MissingInput):
    """A hub model this machine has no copy of and cannot download (entry points print the message alone: it was a
    RuntimeError under three chained tracebacks from huggingface_hub and transformers)."""


def _hub_error(spec: ModelSpec, error: Exception) -> ModelUnavailable:
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
    return ModelUnavailable(
        f"could not load model {spec.name!r} from {spec.hf_id!r}: {error.__class__.__name__}: {str(error)[:300]}\n"
        f"The Hugging Face hub is {'disabled (HF_HUB_OFFLINE=1)' if offline else 'unreachable or the id is wrong'}. "
        "Download the checkpoint on a machine with hub access and point model.hf_id at the local directory, "
        "or pick a tiny model (model=tiny-qwen2 | tiny-llama | tiny-qwen3)."
    )


def checkpoint_name(default: str, hf_id: str | None) -> str:
    """A model's run-directory name: ``default`` for the config's own model, else one read off ``hf_id``.

    Tiny model configs use it (``name: ${zoomr_model_name:tiny-qwen2,${.hf_id}}``), so evaluating a trained
    checkpoint (``model.hf_id=runs/train/<run>/final``) writes under ``<run>``, never over the random tiny
    model's results. ``…/final`` and ``…/checkpoint-N`` are named after their run directory.
    """
    if not hf_id:
        return default
    path = Path(str(hf_id).rstrip("/"))
    if path.name == "final":
        return path.parent.name or default
    if path.name.startswith("checkpoint-"):
        return f"{path.parent.parent.name}-{path.name}" if path.parent.name == "checkpoints" else path.name
    return path.name or default


def register_resolvers() -> None:
    """Register ``${zoomr_model_name:…}``, ``${zoomr_shipped_start:…}`` and ``${zoomr_shipped_with:…}`` with
    OmegaConf (done at import, so any loader of conf/model resolves)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("zoomr_model_name"):
        OmegaConf.register_new_resolver("zoomr_model_name", checkpoint_name)
    if not OmegaConf.has_resolver("zoomr_shipped_start"):
        OmegaConf.register_new_resolver("zoomr_shipped_start", shipped_start)
    if not OmegaConf.has_resolver("zoomr_shipped_with"):
        OmegaConf.register_new_resolver("zoomr_shipped_with", shipped_with)


def shipped_start(hf_id: str | None, shipped: str | None) -> str | None:
    """A trainer's default start checkpoint: the model config's shipped trained instance, unless ``model.hf_id``
    names another model (then ``None``: training starts from ``model.hf_id``, never silently from the shipped one)."""
    return None if hf_id else shipped


def shipped_with(start: str | None, shipped: str | None, value: str | None) -> str | None:
    """A default that belongs to the shipped start model (e.g. AbridgeKV's per-layer schedule, allocated on a model
    trained from it): ``value`` when training starts from ``shipped``, else ``None`` (another start model gets no
    setting measured on this one)."""
    return value if start and shipped and str(start) == str(shipped) else None


register_resolvers()


def spec_from_dict(d: dict[str, Any]) -> ModelSpec:
    """Build a ModelSpec from a (resolved) model config mapping, ignoring unknown-to-spec keys strictly."""
    known = set(ModelSpec.__dataclass_fields__)
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"model config has unknown keys {sorted(unknown)}; expected a subset of {sorted(known)}")
    return ModelSpec(**d)


def describe(model) -> dict[str, Any]:
    """Shape facts about a loaded model (used in run summaries and memory accounting)."""
    c = model.config
    return {
        "model_type": c.model_type,
        "layers": c.num_hidden_layers,
        "heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        "hidden": c.hidden_size,
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype),
    }


__all__ = [
    "ModelPathError",
    "ModelSpec",
    "adapter_base",
    "asdict",
    "build_tiny",
    "checkpoint_dir_problem",
    "checkpoint_name",
    "default_cache_dir",
    "describe",
    "load_adapter_merged",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "local_checkpoint_problem",
    "resolve_model_path",
    "spec_from_dict",
    "tiny_config",
    "tokenizer_vocab_problem",
]
