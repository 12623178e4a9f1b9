"""KVzap training pairs on disk: shards of (h_i, log s⁺_i) per layer plus a manifest (paper §4.1).

Layout of a pairs directory::

    plan.json                      what will be written (settings, model, documents per shard)
    shard-{split}-{k:05d}.safetensors
        h.{l}        (n, D_h)   attention-input hidden state of each sampled token at layer l
        y.{l}        (n, H_kv)  log KVzip+ score per KV head
        y_kvzip.{l}  (n, H_kv)  log KVzip score per KV head (for the KVzip-target ablation)
        doc, pos     (n,)       document index and token position inside the document
    manifest.json                  the plan plus the pair counts, written when every shard exists

Keys are per layer so the fitter reads one layer at a time (``safe_open``) and never holds
(n, L, D_h) in memory. A shard is written to a temporary name and renamed, so a rerun skips
complete shards and redoes the rest (resume).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from zoomr.jsonl import BadRowError, read_json_object
from zoomr.paths import MissingInput
from zoomr.rundir import safetensors_whole
from zoomr.schemas.checks import is_integer

FORMAT = "zoomr-kvzap-pairs/1"
TARGETS = {"kvzip_plus": "y", "kvzip": "y_kvzip"}


def shard_name(split: str, index: int) -> str:
    return f"shard-{split}-{index:05d}.safetensors"


def write_shard(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Atomically write one shard (temporary file + rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=dict(metadata or {}))
    tmp.chmod(0o644)
    tmp.replace(path)


def read_manifest(pairs_dir: str | Path) -> dict[str, Any]:
    path = Path(pairs_dir) / "manifest.json"
    if not path.exists():
        hint = (
            " (plan.json exists: the pipeline did not finish; rerun it to resume)"
            if (Path(pairs_dir) / "plan.json").exists()
            else ""
        )
        raise MissingInput(
            f"no KVzap pairs manifest at {path}{hint}; create pairs with "
            "`python -m data_prep +pipeline=kvzap_pairs`"
        )
    manifest = read_json_object(path, "KVzap pairs manifest")
    if manifest.get("format") != FORMAT:
        raise BadRowError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    check_manifest(path, manifest)
    bad = [s["file"] for s in manifest.get("shards", []) if not safetensors_whole(Path(pairs_dir) / s["file"])]
    if bad:
        raise MissingInput(
            f"KVzap pairs in {pairs_dir}: {len(bad)} shard(s) listed in manifest.json missing or truncated "
            f"({', '.join(bad[:3])}{', …' if len(bad) > 3 else ''}); rerun the pairs pipeline that made them with "
            f"pipeline.out_dir={pairs_dir} and the same settings: it rebuilds only those"
        )
    return manifest


def pairs_pipeline(manifest: dict[str, Any]) -> str:
    """The ``python -m data_prep`` pipeline that made the pairs of ``manifest``: ``kvzap_pairs_testbed`` (its
    settings record the testbed data) or ``kvzap_pairs`` (text sources); the fit's W&B group names it."""
    return "kvzap_pairs_testbed" if "testbed" in (manifest.get("settings") or {}) else "kvzap_pairs"


def check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Refuse a manifest (edited, or written by something else) without what the fit reads: the model's name and
    sizes, the pair counts, and shards of both splits (a missing key was a KeyError traceback, a split without
    shards a ValueError traceback after the fit's run state)."""
    model, shards, counts = manifest.get("model"), manifest.get("shards"), manifest.get("n_pairs")
    wrong = []
    if not (isinstance(model, dict) and isinstance(model.get("name"), str)
            and all(is_integer(model.get(k)) for k in ("layers", "hidden", "kv_heads"))):  # fmt: skip
        wrong.append(f"'model' must name the model and its integer layers, hidden, kv_heads (got {model!r})")
    if not (isinstance(counts, dict) and all(is_integer(counts.get(k)) for k in ("train", "val"))):
        wrong.append(f"'n_pairs' must count the train and val pairs (got {counts!r})")
    if not (isinstance(shards, list) and all(isinstance(s, dict) and isinstance(s.get("file"), str) for s in shards)):
        wrong.append("'shards' must be a list of {file, split} objects")
    else:
        splits = {s.get("split") for s in shards}
        wrong += [f"no {split!r} shard listed" for split in ("train", "val") if split not in splits]
    if wrong:
        raise BadRowError(f"{path}: not a KVzap pairs manifest this fit can read: {'; '.join(wrong)}")


def load_layer(
    pairs_dir: str | Path, layer: int, split: str, target: str = "kvzip_plus", manifest: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """All pairs of one layer and split as float32: X (n, D_h), y (n, H_kv). Pairs holding a NaN or an infinity
    (hidden states that overflowed their dtype) are a :class:`BadRowError` naming the shard: the ridge fit of such a
    layer was NaN everywhere, saved as the surrogate with a held-out R² of 0.0 and no word."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {sorted(TARGETS)}, got {target!r}")
    manifest = manifest or read_manifest(pairs_dir)
    xs, ys = [], []
    for shard in manifest["shards"]:
        if shard["split"] != split:
            continue
        with safe_open(str(Path(pairs_dir) / shard["file"]), framework="pt") as f:
            xs.append(f.get_tensor(f"h.{layer}").float())
            ys.append(f.get_tensor(f"{TARGETS[target]}.{layer}").float())
        bad = {k: int((~torch.isfinite(t[-1])).any(1).sum()) for k, t in (("h", xs), (TARGETS[target], ys))}
        if any(bad.values()):
            counts = ", ".join(f"{n} in {k}.{layer}" for k, n in bad.items() if n)
            raise BadRowError(
                f"KVzap pairs {Path(pairs_dir) / shard['file']}: pairs with a NaN or infinite value ({counts}, of "
                f"{xs[-1].shape[0]}); the model's hidden states or scores overflowed: make the pairs again "
                "(e.g. with model.dtype=float32 or bfloat16)"
            )
    if not xs:
        raise ValueError(
            f"{pairs_dir}: no {split!r} pairs (splits present: {sorted({s['split'] for s in manifest['shards']})})"
        )
    return torch.cat(xs), torch.cat(ys)
