"""Cross-check against NVIDIA's kvpress: our StreamingLLM and SnapKV keep the same rows as its presses.

kvpress pins transformers < 5.3, so it runs in its own virtual environment (``KVPRESS_PYTHON``, default
``/tmp/kvpress-venv/bin/python``): this file doubles as the script that environment runs
(``python tests/test_cache_kvpress.py MODEL_DIR PRESS IDS_JSON OUT_JSON``), dumping the row indices each
press kept per layer and KV head (recovered by matching the compressed keys against the uncompressed ones).
The tests are marked ``optional``: ``python -m pytest -m optional tests/test_cache_kvpress.py``; they skip
when that interpreter or kvpress is missing. Set it up once with::

    python -m venv --system-site-packages /tmp/kvpress-venv && /tmp/kvpress-venv/bin/pip install kvpress
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

KVPRESS_PYTHON = os.environ.get("KVPRESS_PYTHON", "/tmp/kvpress-venv/bin/python")
S, RATIO, WINDOW, KERNEL, N_SINK = 64, 0.5, 8, 5, 4


def dump_kvpress(
    model_dir: str, press_name: str, ids: list[int], out: str
) -> None:  # runs in the kvpress venv
    import torch
    from kvpress import SnapKVPress, StreamingLLMPress
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        full = DynamicCache()
        model(x, past_key_values=full)
        if press_name == "snapkv":
            press = SnapKVPress(compression_ratio=RATIO, window_size=WINDOW, kernel_size=KERNEL)
        else:
            press = StreamingLLMPress(compression_ratio=RATIO, n_sink=N_SINK)
        cache = DynamicCache()
        with press(model):
            model(x, past_key_values=cache)
    kept = []
    for layer in range(len(cache.layers)):
        k_full, k_kept = full.layers[layer].keys[0], cache.layers[layer].keys[0]  # [H, N, d]
        heads = []
        for h in range(k_full.shape[0]):
            match = (k_kept[h][:, None, :] == k_full[h][None, :, :]).all(-1)  # [kept, N]
            heads.append(sorted(match.float().argmax(-1).tolist()))
        kept.append(heads)
    Path(out).write_text(json.dumps(kept))


def _kvpress_available() -> bool:
    if not Path(KVPRESS_PYTHON).exists():
        return False
    return subprocess.run([KVPRESS_PYTHON, "-c", "import kvpress"], capture_output=True).returncode == 0


@pytest.mark.optional
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("press", ["streaming", "snapkv"])
def test_kept_rows_match_kvpress(arch, press, cache_dir, tmp_path):
    if not _kvpress_available():
        pytest.skip(f"kvpress not importable with {KVPRESS_PYTHON} (see this file's docstring)")
    import torch

    from tests.conftest import tiny_spec
    from zoomr.cache import build_policy
    from zoomr.models import build_tiny, load_model

    spec = tiny_spec(arch, num_hidden_layers=2)
    model_dir = build_tiny(spec, cache_dir)
    ids = torch.randint(0, 4000, (S,), generator=torch.Generator().manual_seed(42)).tolist()
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    out = tmp_path / "kept.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    run = subprocess.run(
        [KVPRESS_PYTHON, __file__, str(model_dir), press, str(tmp_path / "ids.json"), str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(out.read_text())

    budget = int(S * (1 - RATIO))
    if press == "snapkv":
        cfg = {
            "policy": "snapkv",
            "budget_rows": budget,
            "window": WINDOW,
            "kernel": KERNEL,
            "pooling": "avgpool",
        }
    else:
        cfg = {"policy": "streaming", "budget_rows": budget, "n_sink": N_SINK}
    model = load_model(spec, cache_dir, attn_implementation="zoomr")
    cache = build_policy(cfg, model.config)
    with torch.no_grad():
        model(torch.tensor([ids]), cache=cache, use_cache=True)
    for layer, heads in enumerate(theirs):
        rows = cache.layers[layer].store.rows()
        ours = [sorted(rows.pos[0, h][rows.valid[0, h]].tolist()) for h in range(len(heads))]
        assert ours == heads, (layer, ours, heads)


if __name__ == "__main__":
    dump_kvpress(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()), sys.argv[4])
