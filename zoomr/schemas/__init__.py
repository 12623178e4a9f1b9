"""Structured-config schemas: plain dataclasses, one module per config group entry.

Each module in this package defines dataclasses and a module-level ``SCHEMAS`` list of
``(group, name, dataclass)``. Entry points call :func:`register_with_hydra` once; a YAML file
``conf/<group>/<x>.yaml`` opts into a schema with ``defaults: [/schema/<group>/<name>@_here_, _self_]``,
so an unknown key or a wrong type fails at compose time with Hydra's own message.

A cache policy's config is not declared here: it lives in the policy's own file and registers with it
(:mod:`zoomr.cache.registry`); :func:`iter_schemas` adds every registered policy as
``("method", <policy>, <its config>)``, so adding a policy is one Python file + one YAML. Adding any other
method = one schema module here (or a dataclass in an existing one) + one YAML.
Library code uses these dataclasses as plain objects and never touches Hydra.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from typing import Any


def iter_schemas() -> Iterator[tuple[str, str, type]]:
    """Every (group, name, dataclass) declared by a module of this package, then every cache policy's."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        yield from getattr(module, "SCHEMAS", [])
    from zoomr.cache.registry import registered

    for policy, config in registered().items():
        yield "method", policy, config


def register_with_hydra() -> None:
    """Store every schema in Hydra's ConfigStore under ``schema/<group>/<name>`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    import zoomr.models  # noqa: F401  (registers the zoomr_model_name resolver of conf/model/tiny-*.yaml)

    cs = ConfigStore.instance()
    for group, name, node in iter_schemas():
        if getattr(node, "policy_name", None) is not None:
            node = node()  # an instance: the node carries the policy's name and policy, filled from the registry
        if group == "":
            cs.store(name=name, node=node)
        else:
            cs.store(group=f"schema/{group}", name=name, node=node)


def optional_of(hint: Any) -> Any:
    """``X`` for a hint ``X | None`` (an optional nested schema is converted like a required one); else ``hint``."""
    import types
    import typing

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def to_dataclass(cls: type, cfg: Any):
    """Turn a (DictConfig or dict) node into the plain dataclass ``cls``, nested dataclasses included.

    A key ``cls`` lacks, or a value its ``__post_init__`` refuses, raises
    :class:`zoomr.schemas.checks.SettingsError` with the schema's message."""
    import dataclasses
    import typing

    from zoomr.schemas.checks import SettingsError, type_problem

    if not isinstance(cfg, dict):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(cfg) - set(fields)
    if unknown:
        raise SettingsError(f"{cls.__name__}: unknown keys {sorted(unknown)}; allowed: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs, wrong = {}, []
    for key, value in cfg.items():
        hint = optional_of(hints.get(key))
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = to_dataclass(hint, value)
        elif problem := type_problem(key, value, hint):
            wrong.append(problem)
        kwargs[key] = value
    if wrong:
        raise SettingsError(f"{cls.__name__}: " + "; ".join(wrong))
    try:
        return cls(**kwargs)
    except SettingsError:
        raise
    except ValueError as e:
        raise SettingsError(str(e)) from e
