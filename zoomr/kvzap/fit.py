"""Fitting KVzap surrogates and scoring them (KVzap paper §4.1, Table 1).

- KVzap-Linear: ridge regression per layer (kvpress fits ``sklearn.linear_model.Ridge()``: alpha 1,
  intercept unpenalised); here in closed form on centred float64 sufficient statistics.
- KVzap-MLP: D_h → hidden → GELU → H_kv, MSE, AdamW (lr 5e-3, torch's default weight decay 0.01),
  15 epochs, batch 512, cosine annealing stepped once per epoch (T_max = epochs, as skorch's
  LRScheduler), gradient-norm clipping 1.0; the output bias starts at the training mean of the
  targets (kvpress starts from torch's default init; the optimum is the same). Layers are fitted one at a time (kvpress fits all layers
  as one network; since the layers share nothing, the only difference is that clipping is per layer).
- R² as the paper reports it: the squared Pearson correlation per head on held-out pairs. The
  coefficient of determination 1 − SSE/SST is reported too: a constant predictor scores ≤ 0 on it.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def fit_ridge(X: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge with intercept: returns (W (H, D), b (H,)) minimising ‖y − XWᵀ − b‖² + α‖W‖²."""
    X, y = X.double(), y.double()
    x_mean, y_mean = X.mean(0), y.mean(0)
    Xc, yc = X - x_mean, y - y_mean
    gram = Xc.T @ Xc
    gram.diagonal().add_(alpha)
    W = torch.linalg.solve(gram, Xc.T @ yc).T  # (H, D)
    b = y_mean - W @ x_mean
    return W.float(), b.float()


def linear_module(W: torch.Tensor, b: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(W.shape[1], W.shape[0])
    with torch.no_grad():
        layer.weight.copy_(W)
        layer.bias.copy_(b)
    return layer


def mlp_module(input_dim: int, hidden_dim: int, output_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, output_dim))


def fit_mlp(
    X: torch.Tensor,
    y: torch.Tensor,
    hidden_dim: int,
    *,
    epochs: int = 15,
    batch_size: int = 512,
    lr: float = 5e-3,
    weight_decay: float = 0.01,
    clip: float = 1.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: bool = True,
    desc: str = "mlp",
) -> tuple[nn.Sequential, list[float]]:
    """Train the two-layer MLP with MSE; returns the module (on CPU) and the mean loss of each epoch."""
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = mlp_module(X.shape[1], hidden_dim, y.shape[1])
    with torch.no_grad():  # start at the constant predictor (targets sit far from 0, e.g. log s⁺ ≈ -8)
        net[2].bias.copy_(y.mean(0))
    net = net.to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    X, y = X.to(device), y.to(device)
    n, losses = X.shape[0], []
    steps = math.ceil(n / batch_size)
    bar = tqdm(total=epochs * steps, desc=desc, disable=not progress, leave=False)
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(device)
        total = 0.0
        for k in range(steps):
            idx = order[k * batch_size : (k + 1) * batch_size]
            loss = nn.functional.mse_loss(net(X[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), clip)
            opt.step()
            total += loss.item() * len(idx)
            bar.update()
        sched.step()
        losses.append(total / n)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    bar.close()
    return net.cpu().eval(), losses


def squared_pearson(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """Per-column squared Pearson correlation (the paper's R²); 0 where the prediction is constant, NaN where the
    target is (undefined: it was 0, even for a perfect prediction)."""
    p, t = pred.double() - pred.double().mean(0), true.double() - true.double().mean(0)
    denom = p.norm(dim=0) * t.norm(dim=0)
    r = torch.where(denom > 0, (p * t).sum(0) / denom.clamp_min(1e-300), torch.zeros_like(denom))
    return torch.where(t.norm(dim=0) > 0, r**2, torch.nan).float()


def determination(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """Per-column coefficient of determination 1 − SSE/SST (a constant predictor scores ≤ 0); NaN where the target
    is constant (SST = 0: it was 1 or an enormous negative number, depending on rounding)."""
    p, t = pred.double(), true.double()
    sse = ((p - t) ** 2).sum(0)
    sst = ((t - t.mean(0)) ** 2).sum(0)
    return torch.where(sst > 0, 1 - sse / sst.clamp_min(1e-300), torch.nan).float()


@torch.no_grad()
def predict(module: nn.Module, X: torch.Tensor, batch_size: int = 65536) -> torch.Tensor:
    return torch.cat([module(X[i : i + batch_size]) for i in range(0, X.shape[0], batch_size)])


def fit_layer(
    X: torch.Tensor,
    y: torch.Tensor,
    kind: str,
    *,
    ridge_alpha: float = 1.0,
    hidden_dim: int | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: bool = True,
    desc: str = "",
    **mlp_kwargs,
) -> nn.Module:
    """One layer's surrogate: ``kind`` = linear (ridge) or mlp (``hidden_dim`` default D_h // 8)."""
    if kind == "linear":
        return linear_module(*fit_ridge(X, y, ridge_alpha))
    if kind == "mlp":
        width = hidden_dim or max(1, X.shape[1] // 8)
        return fit_mlp(X, y, width, seed=seed, device=device, progress=progress, desc=desc, **mlp_kwargs)[0]
    raise ValueError(f"surrogate kind must be linear|mlp, got {kind!r}")


def evaluate_layer(
    pred: torch.Tensor, true: torch.Tensor, train_mean: torch.Tensor
) -> dict[str, list[float]]:
    """Held-out metrics per head: squared Pearson, determination and MSE, and the constant predictor's.

    The constant predictor is the training mean of the targets: its squared Pearson is 0 (a prediction
    without variance correlates with nothing), its determination ≈ 0 and its MSE the targets' variance.
    """
    const = train_mean.expand_as(true)
    return {
        "r2": squared_pearson(pred, true).tolist(),
        "det": determination(pred, true).tolist(),
        "const_r2": squared_pearson(const, true).tolist(),
        "const_det": determination(const, true).tolist(),
        "mse": ((pred - true) ** 2).mean(0).tolist(),
        "const_mse": ((const - true) ** 2).mean(0).tolist(),
    }


def fit_surrogates(
    pairs_dir,
    *,
    kinds: tuple[str, ...] = ("linear", "mlp"),
    target: str = "kvzip_plus",
    ridge_alpha: float = 1.0,
    hidden_dim: int | None = None,
    max_train_pairs: int | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: bool = True,
    **mlp_kwargs,
):
    """Fit every requested surrogate kind layer by layer on a pairs directory.

    Returns ({kind: KVzapModel}, rows) where rows hold held-out metrics per (kind, layer, head).
    """
    from tqdm.auto import tqdm

    from zoomr.kvzap.pairs import load_layer, read_manifest
    from zoomr.kvzap.surrogate import new_surrogate

    manifest = read_manifest(pairs_dir)
    info = manifest["model"]
    n_layers, dim, n_kv = info["layers"], info["hidden"], info["kv_heads"]
    width = hidden_dim or max(1, dim // 8)
    models = {k: new_surrogate(dim, n_kv, n_layers, None if k == "linear" else width) for k in kinds}
    rows = []
    for layer in tqdm(range(n_layers), desc="fitting layers", disable=not progress):
        X, y = load_layer(pairs_dir, layer, "train", target, manifest)
        if max_train_pairs and X.shape[0] > max_train_pairs:
            keep = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(seed))[:max_train_pairs]
            X, y = X[keep], y[keep]
        Xv, yv = load_layer(pairs_dir, layer, "val", target, manifest)
        for kind in kinds:
            module = fit_layer(
                X, y, kind, ridge_alpha=ridge_alpha, hidden_dim=width, seed=seed + layer,
                device=device, progress=progress, desc=f"layer {layer} {kind}", **mlp_kwargs,
            )  # fmt: skip
            models[kind].layers[layer].load_state_dict(module.state_dict())
            metrics = evaluate_layer(predict(module, Xv), yv, y.mean(0))
            for head in range(n_kv):
                rows.append(
                    {"kind": kind, "layer": layer, "head": head, **{k: v[head] for k, v in metrics.items()}}
                )
    return models, rows
