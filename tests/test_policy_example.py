"""README "Add a method": its one-file policy and its YAML, taken from the README as written, register, compose
with Hydra against the real conf/ tree, and decode a tiny model; and the policy interface stays closed."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from zoomr.cache import POLICIES, PolicyCache, build_policy, policy_config
from zoomr.cache.offload import HostRowsMixin, OffloadConfig
from zoomr.engine import DecodeSettings, generate
from zoomr.entry import CONF_DIR
from zoomr.paths import REPO_ROOT
from zoomr.schemas import register_with_hydra


def _section() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    return text[text.index("## Add a method") :]


def _block(lang: str, first_line: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", _section(), re.S)
    (block,) = [b for b in blocks if b.startswith(first_line)]
    return block


@pytest.fixture()
def example(tmp_path):
    """The README's policy file imported as a module, and a copy of conf/ holding the README's YAML."""
    path = tmp_path / "recent.py"
    path.write_text(_block("python", "# zoomr/cache/recent.py"))
    spec = importlib.util.spec_from_file_location("readme_recent_policy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "method" / "recent.yaml").write_text(_block("yaml", "# conf/method/recent.yaml"))
    try:
        spec.loader.exec_module(module)  # registers "recent"
        yield module, conf
    finally:
        POLICIES.pop("recent", None)
        sys.modules.pop(spec.name, None)


def test_readme_policy_registers_composes_and_decodes(example, tiny_model_and_tokenizer):
    module, conf = example
    assert POLICIES["recent"] is module.RecentCache and module.RecentConfig.policy_name == "recent"
    register_with_hydra()
    with initialize_config_dir(str(conf), version_base="1.3"):
        cfg = compose("eval", overrides=["+method=recent", "method.window=8"])
    assert (cfg.method.name, cfg.method.policy, cfg.method.window) == ("recent", "recent", 8)  # from the decorator
    config = policy_config(cfg.method)
    assert type(config) is module.RecentConfig
    with pytest.raises(ValueError, match="window must be >= 1"):
        policy_config({"policy": "recent", "window": 0})

    model, tok = tiny_model_and_tokenizer
    prompt = tok("one two three four five six seven eight nine ten eleven", add_special_tokens=False).input_ids
    assert len(prompt) > 8
    settings = DecodeSettings(12, progress=False, stop_token_ids=[])
    (out,) = generate(model, tok, [prompt], build_policy(config, model.config, tok), settings)
    (full,) = generate(model, tok, [prompt], {"policy": "full"}, settings)
    rows = torch.as_tensor(out.stats.rows)  # [steps, layers, kv heads] rows held after each step
    assert int(rows.max()) == 8 and bool((rows[-1] == 8).all())  # the window, in every layer and head
    assert int(torch.as_tensor(full.stats.rows)[-1].min()) == len(prompt) + 11  # full KV keeps every fed row


def test_policies_cannot_override_the_step_protocol():
    """The interface is closed: a policy reacts in hooks (on_step_begin, …), the base owns the protocol."""
    for method in ("begin_step", "end_step", "update"):
        with pytest.raises(TypeError, match=rf"overrides {method}"):
            type("Bad", (PolicyCache,), {method: lambda self, *a, **k: None})


class _LastTwoRows(HostRowsMixin):
    """A host-resident policy that says attention reads only the last two held rows of each sequence."""

    seen: list[int]

    def on_step_begin(self, step):
        store = self.layers[0].store  # rows held before this step (no layer has its new rows yet)
        self.held = store.n[:, 0].cpu() if store is not None else torch.zeros(step.valid.shape[0], dtype=torch.long)

    def attended_rows(self, layer):
        return torch.stack([torch.tensor([int(x) - 2, int(x) - 1]).clamp_min(-1) for x in self.held])

    def on_queries(self, layer, query):
        self.seen.append(int(layer.view.n.max()))  # rows this step's attention reads at this layer


@pytest.mark.parametrize("prefetch", [False, True])
def test_host_rows_mixin_reads_only_the_rows_the_policy_names(tiny_model_and_tokenizer, prefetch):
    """"Which rows" is the policy's; gathering, copying, prefetching and appending the new token the mixin's."""
    model, tok = tiny_model_and_tokenizer
    cache = _LastTwoRows(OffloadConfig(prefetch=prefetch), model.config)
    cache.seen, cache.prefetch_rows = [], prefetch
    prompt = tok("one two three four five six", add_special_tokens=False).input_ids
    generate(model, tok, [prompt], cache, DecodeSettings(4, progress=False, stop_token_ids=[]))
    layers = cache.num_layers
    assert cache.seen[:layers] == [len(prompt)] * layers  # prefill: its own tokens only
    assert cache.seen[layers:] == [3] * (3 * layers)  # decode: the two named rows + the new token
    assert int(cache.resident_rows().min()) == len(prompt) + 3  # nothing evicted: the host keeps every row


def test_policy_config_is_typed_once_not_per_batch(tiny_model_and_tokenizer, monkeypatch):
    """The evaluator's generator gets the config dataclass and builds a fresh cache per batch from it,
    never turning a dict into the dataclass again."""
    import zoomr.schemas
    from eval.generation import engine_generator
    from zoomr.cache.h2o import H2OConfig
    from zoomr.schemas.eval import GenerationConfig

    model, tok = tiny_model_and_tokenizer
    gen = GenerationConfig(max_new_tokens=3, temperature=0.0)

    def no_flip(*args, **kwargs):
        raise AssertionError("the policy config was rebuilt from a dict")

    monkeypatch.setattr(zoomr.schemas, "to_dataclass", no_flip)
    run = engine_generator(model, tok, H2OConfig(budget_rows=4), gen)
    batches = [run(["a b c d e f g h"], [1]), run(["i j k l m n o p q"], [2])]
    assert [b[0].kv["rows_peak"] for b in batches] == [4.0, 4.0]  # H2O's budget, in both batches
    with pytest.raises(AssertionError, match="rebuilt"):  # a dict config would be converted per batch
        engine_generator(model, tok, {"policy": "h2o", "budget_rows": 4}, gen)(["a b c"], [1])
