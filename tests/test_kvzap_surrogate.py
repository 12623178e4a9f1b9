"""KVzap surrogates: kvpress checkpoint format, ridge/MLP fitting, R² metrics (KVzap paper §3.3, §4.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from zoomr.kvzap.fit import determination, fit_mlp, fit_ridge, linear_module, predict, squared_pearson
from zoomr.kvzap.surrogate import (
    KVzapModel,
    check_matches,
    expected_weight_names,
    load_surrogate,
    new_surrogate,
)

# a separate environment: kvpress 0.5.5 pins transformers<5.3 (see the KVzap README section)
KVPRESS_PYTHON = os.environ.get("KVPRESS_PYTHON", "/tmp/kvzap-kvpress-venv/bin/python")


@pytest.mark.parametrize("hidden_dim", [None, 16])
def test_checkpoint_names_shapes_and_config(tmp_path, hidden_dim):
    model = new_surrogate(64, 4, 3, hidden_dim)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "kvzap"
    assert {k: config[k] for k in ("input_dim", "output_dim", "n_modules", "hidden_dim")} == {
        "input_dim": 64, "output_dim": 4, "n_modules": 3, "hidden_dim": hidden_dim,
    }  # fmt: skip
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    want = expected_weight_names(model.config)
    assert shapes == want
    if hidden_dim is None:
        assert want["layers.2.weight"] == (4, 64)
    else:
        assert want["layers.0.0.weight"] == (16, 64) and want["layers.2.2.weight"] == (4, 16)
    loaded = load_surrogate(tmp_path)
    x = torch.randn(5, 3, 64)
    torch.testing.assert_close(loaded(x), model(x))
    assert loaded(x).shape == (5, 3, 4) and loaded.score(1, x[:, 1]).shape == (5, 4)


def test_loads_a_checkpoint_written_like_nvidias(tmp_path):
    """A checkpoint as kvpress writes it with transformers 4.x (torch_dtype key, bf16 weights) loads here."""
    config = {
        "architectures": ["KVzapModel"], "hidden_dim": 8, "input_dim": 32, "model_type": "kvzap",
        "n_modules": 2, "output_dim": 2, "torch_dtype": "bfloat16", "transformers_version": "4.57.1",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for i in range(2):
        weights[f"layers.{i}.0.weight"] = torch.randn(8, 32, generator=gen).bfloat16()
        weights[f"layers.{i}.0.bias"] = torch.randn(8, generator=gen).bfloat16()
        weights[f"layers.{i}.2.weight"] = torch.randn(2, 8, generator=gen).bfloat16()
        weights[f"layers.{i}.2.bias"] = torch.randn(2, generator=gen).bfloat16()
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model = load_surrogate(tmp_path)
    assert model.kind == "mlp" and model.config.hidden_dim == 8
    h = torch.randn(7, 32, generator=gen)
    w = {k: v.float() for k, v in weights.items()}
    hid = torch.nn.functional.gelu(h @ w["layers.1.0.weight"].T + w["layers.1.0.bias"])
    torch.testing.assert_close(model.score(1, h), hid @ w["layers.1.2.weight"].T + w["layers.1.2.bias"])
    check_matches(model, hidden_size=32, num_layers=2, num_kv_heads=2)
    with pytest.raises(ValueError, match="does not match"):
        check_matches(model, hidden_size=32, num_layers=3, num_kv_heads=2)
    with pytest.raises(FileNotFoundError, match="no KVzap checkpoint"):
        load_surrogate(tmp_path / "missing")


def test_a_torn_or_mismatched_surrogate_is_refused_naming_the_file(tmp_path):
    """A truncated ``model.safetensors`` or a torn ``config.json`` ended in a safetensors / OSError traceback; a
    config with more layers than the weights loaded with random surrogate layers and only a load report."""
    from zoomr.models import ModelPathError

    new_surrogate(32, 2, 2, 8).save_pretrained(tmp_path)
    load_surrogate(tmp_path)
    whole, config = (tmp_path / "model.safetensors").read_bytes(), (tmp_path / "config.json").read_text()
    (tmp_path / "model.safetensors").write_bytes(whole[:100])
    with pytest.raises(FileNotFoundError, match=f"KVzap checkpoint {tmp_path}: truncated weights: model.safetensors"):
        load_surrogate(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(whole)
    (tmp_path / "config.json").write_text(config[:20])
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        load_surrogate(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**json.loads(config), "n_modules": 3}))
    with pytest.raises(ModelPathError, match=r"weights do not match its config.json: 4 missing \(layers.2."):
        load_surrogate(tmp_path)


def test_ridge_matches_normal_equations_and_metrics():
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(500, 10, generator=gen) + 3.0
    W_true = torch.randn(2, 10, generator=gen)
    y = X @ W_true.T + torch.tensor([1.0, -7.0]) + 0.1 * torch.randn(500, 2, generator=gen)
    W, b = fit_ridge(X, y, alpha=0.0)
    torch.testing.assert_close(W, W_true, atol=0.05, rtol=0)
    # the intercept is not penalised: huge alpha shrinks W to 0 and leaves the mean
    W0, b0 = fit_ridge(X, y, alpha=1e12)
    assert W0.abs().max() < 1e-6
    torch.testing.assert_close(b0, y.mean(0), atol=1e-4, rtol=0)
    # ridge objective is minimal at the solution (perturbations do worse)
    alpha = 50.0
    W, b = fit_ridge(X, y, alpha)

    def objective(W_, b_):
        return ((y - X @ W_.T - b_) ** 2).sum() + alpha * (W_**2).sum()

    best = objective(W, b)
    for _ in range(5):
        assert objective(W + 1e-2 * torch.randn_like(W), b) > best
    pred = predict(linear_module(W, b), X)
    assert (squared_pearson(pred, y) > 0.95).all() and (determination(pred, y) > 0.95).all()
    assert (determination(y.mean(0).expand_as(y), y).abs() < 1e-6).all()
    torch.testing.assert_close(squared_pearson(-2 * y + 5, y), torch.ones(2))


def test_mlp_learns_a_nonlinear_target_better_than_linear():
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(24000, 16, generator=gen)
    y = torch.stack([X[:, 0] ** 2 - 5.0, (X[:, 1] * X[:, 2]) - 3.0], dim=1)
    net, losses = fit_mlp(
        X[:20000], y[:20000], hidden_dim=32, epochs=15, batch_size=512, lr=5e-3, progress=False
    )
    assert losses[-1] < losses[0] / 5
    r2_mlp = squared_pearson(predict(net, X[20000:]), y[20000:])
    r2_lin = squared_pearson(predict(linear_module(*fit_ridge(X[:20000], y[:20000])), X[20000:]), y[20000:])
    assert (r2_mlp > 0.8).all() and (r2_lin < 0.1).all()


@pytest.mark.optional
@pytest.mark.skipif(not Path(KVPRESS_PYTHON).exists(), reason=f"no kvpress interpreter at {KVPRESS_PYTHON}")
@pytest.mark.parametrize("hidden_dim", [None, 8])
def test_round_trip_with_kvpress(tmp_path, hidden_dim):
    """Ours → kvpress.KVzapModel → same predictions; kvpress's save → ours → same predictions."""
    ours = new_surrogate(32, 2, 3, hidden_dim)
    ours.save_pretrained(tmp_path / "ours")
    x = torch.randn(6, 3, 32)
    torch.save(x, tmp_path / "x.pt")
    script = f"""
import torch
from kvpress.presses.kvzap_press import KVzapModel
m = KVzapModel.from_pretrained({str(tmp_path / "ours")!r})
x = torch.load({str(tmp_path / "x.pt")!r})
torch.save(m(x).detach(), {str(tmp_path / "kvpress_pred.pt")!r})
m2 = KVzapModel(m.config)
for p in m2.parameters():
    torch.nn.init.normal_(p)
m2.save_pretrained({str(tmp_path / "theirs")!r})
torch.save(m2(x).detach(), {str(tmp_path / "theirs_pred.pt")!r})
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [KVPRESS_PYTHON, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    torch.testing.assert_close(torch.load(tmp_path / "kvpress_pred.pt"), ours(x).detach())
    theirs = load_surrogate(tmp_path / "theirs")
    assert isinstance(theirs, KVzapModel) and theirs.config.hidden_dim == hidden_dim
    torch.testing.assert_close(theirs(x).detach(), torch.load(tmp_path / "theirs_pred.pt"))
    assert sys.executable != KVPRESS_PYTHON
