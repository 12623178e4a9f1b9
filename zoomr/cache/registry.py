"""Policy registry: ``@register_policy("name", Config)`` and ``build_policy(cfg, model_config)``.

A policy module anywhere in ``zoomr/cache/`` defines its config dataclass and registers both at import;
:func:`build_policy` imports every module of the package on a miss, and Hydra's schemas are read from here
(:func:`registered`), so adding a policy is one file plus one YAML, no list to edit.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping
from numbers import Real
from typing import Any

from zoomr.cache.base import PolicyCache

POLICIES: dict[str, type[PolicyCache]] = {}


def register_policy(name: str, config: type) -> Callable[[type[PolicyCache]], type[PolicyCache]]:
    """Class decorator: make ``cls`` buildable as ``policy: <name>`` with hyperparameters ``config`` (a
    dataclass with ``name`` and ``policy`` fields, which it fills from ``name``: see
    :mod:`zoomr.cache.config`). The one place a policy's name is written."""

    def wrap(cls: type[PolicyCache]) -> type[PolicyCache]:
        if name in POLICIES and POLICIES[name] is not cls:
            raise ValueError(f"policy {name!r} registered twice ({POLICIES[name].__name__}, {cls.__name__})")
        owner = config.__dict__.get("policy_name")
        if owner is not None and owner != name:
            raise ValueError(f"{config.__name__} already configures policy {owner!r}, not {name!r}")
        missing = {"name", "policy"} - {f.name for f in dataclasses.fields(config)}
        if missing:
            raise TypeError(f"{config.__name__} (config of policy {name!r}) lacks the fields {sorted(missing)}")
        cls.policy_name, cls.config_class = name, config
        config.policy_name = name
        POLICIES[name] = cls
        return cls

    return wrap


def _discover() -> None:
    import zoomr.cache as package

    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")


def registered() -> dict[str, type]:
    """Every policy of the package and its config dataclass, ``{policy name: config class}``."""
    _discover()
    return {name: cls.config_class for name, cls in sorted(POLICIES.items())}


def policy_class(name: str) -> type[PolicyCache]:
    if name not in POLICIES:
        _discover()
    if name not in POLICIES:
        raise KeyError(f"unknown cache policy {name!r}; registered: {sorted(POLICIES)}")
    return POLICIES[name]


def policy_config(cfg: Any) -> Any:
    """The policy's config dataclass from a dataclass, a dict or an OmegaConf node (unknown keys are errors)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return cfg
    if isinstance(cfg, str):  # OmegaConf's 'Input cfg is not an OmegaConf config object (str)' otherwise
        raise ValueError(
            f"a cache policy config is a config dataclass, a dict or an OmegaConf node, not the name {cfg!r}: "
            f"zoomr.configs.method_config({cfg!r}) loads conf/method/{cfg}.yaml"
        )
    if not isinstance(cfg, Mapping):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg = dict(cfg)
    name = cfg.get("policy") or cfg.get("name")
    if name is None:
        raise ValueError(f"cache policy config needs a 'policy' field, got keys {sorted(cfg)}")
    from zoomr.schemas import to_dataclass

    return to_dataclass(policy_class(name).config_class, cfg)


def build_policy(cfg: Any, model_config: Any, tokenizer: Any = None, **kwargs: Any) -> PolicyCache:
    """A fresh cache for one ``generate`` call: ``build_policy(cfg.method, model.config, tokenizer)``."""
    config = policy_config(cfg)
    if getattr(config, "budget_pending", False):
        raise ValueError(
            f"policy {config.policy!r}: budget_fraction / budget_match are relative to other runs; python -m eval "
            "resolves them from the run directories; in Python set the rows with match_budget(cfg, rows)"
        )
    return policy_class(config.policy)(config, model_config, tokenizer=tokenizer, **kwargs)


def has_row_budget(cfg: Any) -> bool:
    """Whether the policy evicts down to ``budget_rows`` (StreamingLLM, H2O, SnapKV, R-KV), as opposed to
    keeping everything (full, offload) or deciding by its own rule (thresholds, blocks, code rows)."""
    config = policy_config(cfg)
    evicts = getattr(config, "evicts_to_budget", None)  # AbridgeKV / LightThinker configs have no budget fields
    return bool(evicts and evicts())


def match_budget(cfg: Any, rows: float) -> Any:
    """``cfg`` with ``budget_rows`` set to ``rows`` (rounded): give a baseline another arm's measured mean
    (or a fraction of full KV's rows); a relative budget (``budget_fraction``/``budget_match``) is consumed."""
    config = policy_config(cfg)
    if not has_row_budget(config):
        raise ValueError(f"policy {config.policy!r} has no row budget (budget_rows)")
    if isinstance(rows, bool) or not isinstance(rows, Real) or not math.isfinite(rows) or round(rows) < 1:
        raise ValueError(  # was max(1, round(rows)): 0, -5 or 0.2 rows silently became a budget of 1 row
            f"match_budget: rows={rows!r} is not a row budget for policy {config.policy!r} (need a finite number "
            "that rounds to at least 1 row)"
        )
    return dataclasses.replace(
        config, budget_rows=round(rows), budget_fraction=None, budget_reference=None, budget_match=None
    )


def serving_settings(method: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``method`` (a ``+method=`` node as plain containers) without the fields only its trainer reads (the config
    class's ``TRAINING_ONLY``: AbridgeKV's optimiser and loop, KVzap's fit, …): what decides a served result row.
    The evaluator fingerprints this, so a changed training default does not refuse resuming an evaluation. A node
    without a registered policy is returned as it is."""
    if method is None:
        return None
    config = registered().get(method.get("policy"))
    drop = set(getattr(config, "TRAINING_ONLY", ()))
    return {k: v for k, v in method.items() if k not in drop}


def served_checkpoints(method: Mapping[str, Any] | None) -> dict[str, str]:
    """The content of the files a policy loads beside its settings (KVzap's surrogate checkpoint: its config class's
    ``served_files(method)``), as ``{"served_<name>": "<path>, sha256 <digest>"}``. The evaluator fingerprints
    this with :func:`serving_settings`: a surrogate fitted again into the same ``surrogate_dir`` serves other rows."""
    from zoomr.paths import MissingInput
    from zoomr.rundir import checkpoint_digest

    files = getattr(registered().get(method.get("policy")), "served_files", None) if method is not None else None
    out = {}
    for name, path in (files(method) if files else {}).items():
        if not (path / "config.json").is_file():  # before a fingerprint names an empty digest
            raise MissingInput(f"method: no {name} checkpoint at {path} (config.json and weights)")
        out[f"served_{name}"] = f"{path}, sha256 {checkpoint_digest(path)}"
    return out
