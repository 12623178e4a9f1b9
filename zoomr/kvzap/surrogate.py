"""KVzap surrogate models in NVIDIA/kvpress's checkpoint format (KVzap paper §3.3, §4.1).

One module per layer maps the attention input h_t ∈ R^{D_h} to H_kv predicted log KVzip+ scores:
``Linear(D_h, H_kv)`` (KVzap-Linear) or ``Linear(D_h, D_h/8) → GELU → Linear(D_h/8, H_kv)`` (KVzap-MLP).

The on-disk format is kvpress's (``kvpress/presses/kvzap_press.py``), so NVIDIA's published
surrogates (``nvidia/KVzap-{linear,mlp}-<model>``) load here and ours load in kvpress:
``config.json`` with ``model_type="kvzap"``, ``input_dim``, ``output_dim``, ``n_modules``,
``hidden_dim`` (null = linear); ``model.safetensors`` with ``layers.{i}.weight|bias`` (linear) or
``layers.{i}.0.weight|bias`` and ``layers.{i}.2.weight|bias`` (MLP; index 1 is the GELU).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

from zoomr.jsonl import read_json_object
from zoomr.paths import MissingInput
from zoomr.rundir import weights_problems


class KVzapConfig(PreTrainedConfig):
    """Shape of a KVzap surrogate: ``n_modules`` layers of ``input_dim → [hidden_dim →] output_dim``."""

    model_type = "kvzap"

    input_dim: int = 0  # D_h, the base model's hidden size
    output_dim: int = 0  # H_kv, KV heads per layer
    n_modules: int = 0  # L, the base model's layers
    hidden_dim: int | None = None  # None: linear; else the MLP width (paper: D_h / 8)


class KVzapModel(PreTrainedModel):
    """A list of per-layer score predictors; ``forward(x)`` with x (T, L, D_h) returns (T, L, H_kv)."""

    config_class = KVzapConfig
    base_model_prefix = "kvzap"
    _no_split_modules: list[str] = []

    def __init__(self, config: KVzapConfig):
        super().__init__(config)
        if min(config.input_dim, config.output_dim, config.n_modules) < 1:
            raise ValueError(f"KVzapConfig needs positive input_dim/output_dim/n_modules, got {config}")
        self.layers = nn.ModuleList(_layer(config) for _ in range(config.n_modules))
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:  # keep torch's default nn.Linear init
        pass

    @property
    def kind(self) -> str:
        return "linear" if self.config.hidden_dim is None else "mlp"

    def score(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """Predicted log KVzip+ scores of layer ``layer_idx``: (..., D_h) → (..., H_kv), in float32."""
        module = self.layers[layer_idx]
        weight = next(module.parameters())
        return module(hidden.to(weight.dtype)).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([module(x[:, i, :]) for i, module in enumerate(self.layers)], dim=1)


def _layer(config: KVzapConfig) -> nn.Module:
    if config.hidden_dim is None:
        return nn.Linear(config.input_dim, config.output_dim)
    return nn.Sequential(
        nn.Linear(config.input_dim, config.hidden_dim),
        nn.GELU(),
        nn.Linear(config.hidden_dim, config.output_dim),
    )


def new_surrogate(
    input_dim: int, output_dim: int, n_modules: int, hidden_dim: int | None = None
) -> KVzapModel:
    """A randomly initialised surrogate (nn.Linear's default init)."""
    return KVzapModel(
        KVzapConfig(input_dim=input_dim, output_dim=output_dim, n_modules=n_modules, hidden_dim=hidden_dim)
    )


def expected_weight_names(config: KVzapConfig) -> dict[str, tuple[int, ...]]:
    """The safetensors keys and shapes kvpress writes and reads for ``config``."""
    names: dict[str, tuple[int, ...]] = {}
    for i in range(config.n_modules):
        if config.hidden_dim is None:
            names[f"layers.{i}.weight"] = (config.output_dim, config.input_dim)
            names[f"layers.{i}.bias"] = (config.output_dim,)
        else:
            names[f"layers.{i}.0.weight"] = (config.hidden_dim, config.input_dim)
            names[f"layers.{i}.0.bias"] = (config.hidden_dim,)
            names[f"layers.{i}.2.weight"] = (config.output_dim, config.hidden_dim)
            names[f"layers.{i}.2.bias"] = (config.output_dim,)
    return names


FIT_RECORD = "fitted_by.json"  # beside each surrogate checkpoint: the fit's run directory and the model it fitted


def model_identity(name_or_path: str | None) -> str | None:
    """A model as a fit record names it: a local checkpoint's resolved directory, else the hub id as given."""
    if not name_or_path:
        return None
    path = Path(name_or_path).expanduser()
    return str(path.resolve()) if path.exists() else name_or_path


def fitted_for(path: str | Path) -> str | None:
    """The model the surrogate at ``path`` was fitted for (:func:`model_identity`), when its fit recorded one."""
    record = Path(path) / FIT_RECORD
    if not record.is_file():  # NVIDIA's downloads, fits made before the record
        return None
    model = read_json_object(record, "KVzap fit record").get("model")
    return model if isinstance(model, str) else None


def load_surrogate(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> KVzapModel:
    """Load a KVzap checkpoint directory (ours or NVIDIA's) and check it against the kvpress layout."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise MissingInput(
            f"no KVzap checkpoint at {path} (expected config.json + model.safetensors, as written by "
            "`python -m train +method=kvzap` or published as nvidia/KVzap-*)"
        )
    read_json_object(path / "config.json", "KVzap surrogate config")  # a torn or edited file, named
    if wrong := weights_problems(path):
        raise MissingInput(f"KVzap checkpoint {path}: {'; '.join(wrong)} (fit it again: `python -m train +method=kvzap`)")
    from zoomr.models import load_matching_weights

    model = load_matching_weights(path, model_class=KVzapModel, dtype=dtype or torch.float32)
    return model.to(device).eval()


def check_matches(model: KVzapModel, *, hidden_size: int, num_layers: int, num_kv_heads: int) -> None:
    """Fail clearly when a surrogate was fitted for another base model."""
    c = model.config
    got = (c.input_dim, c.n_modules, c.output_dim)
    want = (hidden_size, num_layers, num_kv_heads)
    if got != want:
        raise ValueError(
            f"KVzap surrogate shape (input_dim, n_modules, output_dim) = {got} does not match the model's "
            f"(hidden_size, num_hidden_layers, num_key_value_heads) = {want}"
        )
