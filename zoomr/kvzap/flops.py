"""Surrogate compute relative to the model's linear layers (KVzap paper §4.2, Appendix B, Table 3).

Per token and layer, counting multiply-adds of the linear projections only (attention scores, norms and
activations excluded, as in the paper): the model spends q/k/v/o projections plus the gated MLP
(``D·H·d + 2·D·H_kv·d + H·d·D + 3·D·I``); KVzap-Linear spends ``D·H_kv``, KVzap-MLP
``D·D/8 + D/8·H_kv`` (bias adds ignored). The embedding and LM head are left out of the model's count.

    python -m zoomr.kvzap.flops            # table + JSON for the tiny model and Qwen3-8B / Llama-3.1-8B / Qwen3-32B
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

# Shapes from the models' config.json on the Hugging Face hub (not reachable from here).
KNOWN = {
    "Qwen3-8B": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288, layers=36),
    "Llama-3.1-8B": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, layers=32),
    "Qwen3-32B": dict(hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600, layers=64),
    "tiny (foundation default)": dict(
        hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, layers=4
    ),
}


@dataclass
class FlopRatio:
    model: str
    model_macs_per_layer: int
    linear_macs: int
    mlp_macs: int
    linear_ratio: float
    mlp_ratio: float


def shapes_of(config) -> dict[str, int]:
    """The shapes :func:`ratio` needs, from a transformers config."""
    heads = config.num_attention_heads
    return dict(
        hidden=config.hidden_size,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        intermediate=config.intermediate_size,
        layers=config.num_hidden_layers,
    )


def ratio(
    name: str, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, layers: int = 0
) -> FlopRatio:
    model = hidden * heads * head_dim * 2 + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate
    linear = hidden * kv_heads
    width = hidden // 8
    mlp = hidden * width + width * kv_heads
    return FlopRatio(name, model, linear, mlp, linear / model, mlp / model)


def main(argv: list[str] | None = None) -> list[FlopRatio]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = [ratio(name, **shape) for name, shape in KNOWN.items()]
    print(f"{'model':<28}{'model MACs/layer/token':>24}{'KVzap-Linear':>16}{'KVzap-MLP':>14}")
    for r in rows:
        print(f"{r.model:<28}{r.model_macs_per_layer:>24,}{r.linear_ratio:>15.4%}{r.mlp_ratio:>14.3%}")
    if args.json:  # the table's numbers, written only (they were also printed as JSON below the table)
        with open(args.json, "w") as f:
            f.write(json.dumps([asdict(r) for r in rows], indent=1))
        print(f"written {args.json}")
    return rows


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
