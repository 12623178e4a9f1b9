"""The README, slurm/README and the ZoomR testbed history as a newcomer runs them: every ``python -m <entry point>``
command they show composes with Hydra as written (sweeps expanded point by point), names a model it can build a
spec for and a method its entry point accepts, every other ``python -m`` module exists, and the Python API snippet
runs."""

from __future__ import annotations

import importlib.util
import itertools
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from zoomr.cache import policy_config
from zoomr.entry import CONF_DIR, model_spec
from zoomr.paths import REPO_ROOT
from zoomr.schemas import register_with_hydra

register_with_hydra()
DOCS = ["README.md", "slurm/README.md", "analysis/results/zoomr_testbed/HISTORY.md"]
HYDRA_ENTRIES = {"train", "eval", "data_prep", "analysis"}
FLAGS = {"--multirun", "-m"}


def _fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _shell_commands(block: str) -> list[str]:
    """Commands of a bash block: continuations joined, comments and backgrounding dropped, && chains split,
    shell variables the block sets (``G="generation.… …"``) expanded."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out, env = [], {}
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if (m := re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(.*)", line)) and "python -m" not in line:
            env[m[1]] = " ".join(shlex.split(m[2]))
            continue
        line = re.sub(r"\$([A-Z_][A-Z0-9_]*)\b", lambda v: env.get(v[1], v[0]), line)
        out += [part.strip().rstrip("&").strip() for part in line.split("&&")]
    return out


def commands() -> list[tuple[str, str]]:
    """(document, command) for every ``python -m`` command in a fenced block or an inline code span."""
    found = []
    for doc in DOCS:
        text = (REPO_ROOT / doc).read_text()
        for block in _fenced(text, "bash"):
            found += [(doc, c) for c in _shell_commands(block)]
        found += [(doc, c) for c in re.findall(r"`((?:[A-Z_]+=\S+ )*python -m [^`]+)`", text)]
    return [(doc, c[c.index("python -m") :]) for doc, c in found if "python -m" in c]


def _placeholder(arg: str) -> bool:
    return bool(re.search(r"<[^>]*>|(^|\s)\[|…|\.\.\.", arg))  # <name>, [optional], … (a list value is no placeholder)


def _points(overrides: list[str], multirun: bool) -> list[list[str]]:
    """One override list per sweep point (comma lists expanded in a multirun)."""
    if not multirun:
        return [overrides]
    options = [[f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")] if "=" in o and "," in o
               and not o.split("=", 1)[1].startswith(("[", "{")) else [o] for o in overrides]  # fmt: skip
    return [list(p) for p in itertools.product(*options)]


CASES = commands()


def test_the_readmes_show_commands():
    entries = {shlex.split(c)[2] for _, c in CASES}
    assert {"train", "eval", "data_prep", "eval.compare", "analysis.testbed_table"} <= entries
    assert len(CASES) > 30


@pytest.mark.parametrize(("doc", "command"), CASES, ids=[f"{d}:{c[:70]}" for d, c in CASES])
def test_command_composes(doc, command):
    argv = shlex.split(command)
    module = argv[2]
    if _placeholder(module):
        pytest.skip("a placeholder (the layout table)")
    if module not in HYDRA_ENTRIES:
        assert importlib.util.find_spec(module) is not None, f"{doc}: no module {module!r}"
        return
    args = [a for a in argv[3:] if a not in FLAGS]
    multirun = any(a in FLAGS for a in argv[3:])
    if multirun:
        assert argv[3] in FLAGS, f"{doc}: --multirun must come before the overrides: {command}"
    if _placeholder(command[len("python -m") :]):
        pytest.skip("a placeholder argument")
    for overrides in _points(args, multirun):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(module, overrides=overrides)
        spec = model_spec(cfg)  # e.g. hf_id on a tiny config: no model.tiny=null needed
        assert spec.name
        method = cfg.get("method")
        if module == "train" and method is not None:
            assert method.get("trainer"), f"{doc}: {method.name} trains nothing: {command}"
        if module == "eval" and method is not None:
            assert method.get("policy"), f"{doc}: {method.name} is no cache policy: {command}"
            policy_config(OmegaConf.to_container(method, resolve=True))  # the schema's own checks


def test_python_api_snippet_runs(cache_dir, monkeypatch):
    blocks = _fenced((REPO_ROOT / "README.md").read_text(), "python")
    (snippet,) = [b for b in blocks if not b.startswith("# zoomr/")]  # "Add a method": tests/test_policy_example.py
    monkeypatch.setenv("ZOOMR_CACHE", cache_dir)
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)  # noqa: S102  (the README's own code)
    outs = scope["outs"]
    assert len(outs) == 2 and all(o.text for o in outs)
    assert outs[0].stats.rows.shape[1:] == (4, 2) and outs[0].stats.rows[-1].max() <= 16  # H2O's 16 rows
