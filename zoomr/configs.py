"""Group configs by name, for notebooks and scripts: ``method_config("h2o", budget_rows=64)``.

``conf/<group>/<name>.yaml`` opens with a Hydra ``defaults`` list naming its schema
(``/schema/<group>/<schema>@_here_``), so ``OmegaConf.load`` alone gives a node that is neither validated
nor loadable as a dataclass. These helpers read the file, drop the defaults list, apply keyword overrides
(nested dicts for nested fields), resolve it and build the schema dataclass, whose checks run as they do
at compose time. No Hydra state is read; entries interpolating other groups (``${model.name}``) need the
entry point (``python -m train|eval``) instead.
"""

from __future__ import annotations

import re
from typing import Any

from zoomr.paths import REPO_ROOT

CONF_DIR = REPO_ROOT / "conf"
_SCHEMA_ENTRY = re.compile(r"^/?schema/(?P<group>[\w/]+)/(?P<name>\w+)@_here_$")


def available(group: str) -> list[str]:
    """The names ``conf/<group>/`` offers."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _node(group: str, name: str) -> tuple[type | None, Any]:
    """(schema dataclass, merged node) of ``conf/<group>/<name>.yaml``, following same-group defaults entries
    (``defaults: [kvzap, _self_]``)."""
    from omegaconf import OmegaConf

    from zoomr.schemas import iter_schemas

    path = CONF_DIR / group / f"{name}.yaml"
    if not path.is_file():  # a name the user gave (--model, --policies): printed by the scripts, not a traceback
        from zoomr.schemas.checks import SettingsError

        raise SettingsError(f"no {group} config {name!r}; available: {', '.join(available(group))}")
    node = OmegaConf.load(path)
    schema, merged = None, OmegaConf.create({})
    for entry in list(node.pop("defaults", [])):
        if entry == "_self_":
            continue
        if OmegaConf.is_dict(entry) and all(str(k).startswith("override /") for k in entry):
            continue  # selects another group's default for the entry point (AbridgeKV: data=testbed)
        if not isinstance(entry, str):
            raise ValueError(f"{path}: defaults entry {entry!r} needs the entry point (python -m train|eval)")
        if m := _SCHEMA_ENTRY.match(entry):
            key = (m["group"], m["name"])
            schema = next((cls for g, n, cls in iter_schemas() if (g, n) == key), None)
            if schema is None:
                raise ValueError(f"{path}: schema {key} is not registered in zoomr.schemas")
        else:
            schema, parent = _node(group, entry)
            merged = OmegaConf.merge(merged, parent)
    return schema, OmegaConf.merge(merged, node)


def schema_of(group: str, name: str) -> type | None:
    """The schema dataclass ``conf/<group>/<name>.yaml`` opts into (through same-group defaults), or None."""
    return _node(group, name)[0]


def load_config(group: str, name: str, context: dict[str, Any] | None = None, **overrides: Any) -> Any:
    """``conf/<group>/<name>.yaml`` with ``overrides`` as its schema dataclass (unknown keys are errors).

    ``context``: other groups its interpolations read (``{"model": {"name": "tiny-qwen2"}}``).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    import zoomr.models  # noqa: F401  (registers the resolver of the tiny model configs)
    from zoomr.schemas import to_dataclass

    schema, node = _node(group, name)
    if schema is None:
        raise ValueError(f"conf/{group}/{name}.yaml names no '/schema/{group}/<name>@_here_' in its defaults")
    root = OmegaConf.create({**(context or {}), group: OmegaConf.merge(node, OmegaConf.create(overrides))})
    try:
        plain = OmegaConf.to_container(root[group], resolve=True)
    except InterpolationResolutionError as e:
        raise ValueError(f"conf/{group}/{name}.yaml reads another group ({e}); pass it in context=") from e
    return to_dataclass(schema, plain)


def trainable_methods() -> list[str]:
    """The method configs ``python -m train`` runs (a ``trainer``), decoding-only policies left out."""
    from omegaconf import OmegaConf

    out = []
    for name in available("method"):
        try:
            trainer = getattr(method_config(name), "trainer", None)
        except ValueError:  # reads another group (abridge_allocate's checkpoint path): its own YAML says
            trainer = OmegaConf.load(CONF_DIR / "method" / f"{name}.yaml").get("trainer")
        if trainer:
            out.append(name)
    return out


def method_config(name: str, model: str = "tiny-qwen2", **overrides: Any) -> Any:
    """A ``+method=<name>`` config as its dataclass: ``build_policy(method_config("snapkv"), model.config, tok)``.

    ``model``: the ``model=`` choice its paths interpolate (``+method=kvzap``: ``runs/kvzap/${model.name}``).
    """
    from dataclasses import asdict

    return load_config("method", name, context={"model": asdict(model_config(model))}, **overrides)


def model_config(name: str, **overrides: Any):
    """A ``model=<name>`` config as a :class:`zoomr.models.ModelSpec` for ``load_model_and_tokenizer``."""
    from dataclasses import asdict

    from zoomr.models import spec_from_dict

    return spec_from_dict(asdict(load_config("model", name, **overrides)))
