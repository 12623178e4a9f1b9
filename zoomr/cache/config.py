"""The fields every cache policy's config has, and the checks they share.

A policy's hyperparameters are a dataclass in the policy's own file (``zoomr/cache/<policy>.py``),
registered with it: ``@register_policy("h2o", H2OConfig)``. That decorator is the one place a policy's
name is written: it sets ``H2OConfig.policy_name``, from which ``policy`` (the registry key) and ``name``
(the run's label, default the policy; variants such as ``evict_recency`` or ``sumr`` set their own) are
filled when left empty. Hydra's schema ``/schema/method/<policy>`` is that dataclass too
(:func:`zoomr.schemas.register_with_hydra`), so a YAML names neither.

Budget fields: ``budget_rows`` (rows per (layer, sequence, KV head) resident between decode steps; ``None``
= unbounded). A budget relative to the run (``python -m eval`` resolves it into ``budget_rows`` before
decoding, see ``eval/budget.py``): ``budget_fraction`` f = f x the rows full KV holds at the end of a
sequence (its mean peak resident rows, read from the full-KV run ``budget_reference``, default the same
benchmark and model's ``…/full`` run), or ``budget_match`` = a run directory whose mean resident rows the
budget takes. In Python, ``zoomr.cache.match_budget(cfg, rows)`` does the same with a number. A policy evicts to
a budget when its config declares a default ``budget_rows`` (:meth:`PolicyConfig.evicts_to_budget`); the others
(full, offload, ZoomR, KVzap, KVzip, the block ablation) refuse any budget setting, which they would ignore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


def check_positive(cls_name: str, **values: int | float | None) -> None:
    """``ValueError`` naming the first field that is set and not > 0."""
    for key, value in values.items():
        if value is not None and value <= 0:
            raise ValueError(f"{cls_name}: {key} must be > 0, got {value}")


def check_ratio(cls_name: str, ratio: float, budget_rows: int | None) -> None:
    """A prompt compression ratio (kvpress's ``compression_ratio``) replaces the fixed budget."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"{cls_name}: compression_ratio must be in [0, 1), got {ratio}")
    if budget_rows is not None:
        raise ValueError(
            f"{cls_name}: compression_ratio={ratio} replaces budget_rows={budget_rows}: set method.budget_rows=null"
        )


def fill_names(config: Any) -> None:
    """Set ``config.policy`` (when empty) to the policy its class is registered for, refuse another one, and
    default ``config.name`` to the policy."""
    cls = type(config)
    registered = getattr(cls, "policy_name", None)
    if not config.policy:
        if registered is None:
            raise ValueError(f"{cls.__name__}: policy is empty and {cls.__name__} is registered for no policy")
        config.policy = registered
    elif registered is not None and config.policy != registered:
        raise ValueError(
            f"{cls.__name__}: policy={config.policy!r}, but {cls.__name__} configures policy {registered!r}"
        )
    if not config.name:
        config.name = config.policy


@dataclass
class PolicyConfig:
    """Fields every cache policy has (``name``/``policy`` filled from the registration, see the module)."""

    policy_name: ClassVar[str | None] = None  # set by @register_policy
    name: str = ""  # the run's label ("" = the policy's name)
    policy: str = ""  # the registry key ("" = the policy this dataclass is registered for)
    trainer: str | None = None  # cache policies are inference-time methods: nothing to train
    page_size: int = 16
    budget_rows: int | None = None
    budget_fraction: float | None = None  # of full KV's rows (resolved into budget_rows by python -m eval)
    budget_reference: str | None = None  # the full-KV run directory for budget_fraction (None: …/full)
    budget_match: str | None = None  # a run directory: budget_rows = its mean resident rows

    def __post_init__(self) -> None:
        from zoomr.schemas.checks import check_types

        check_types(self, "method")  # a config built in code: offload="false" would be truthy, 16.5 rows a float
        fill_names(self)
        name = type(self).__name__
        check_positive(name, page_size=self.page_size, budget_rows=self.budget_rows)
        if not self.evicts_to_budget():
            given = {k: v for k in ("budget_rows", "budget_fraction", "budget_match")
                     if (v := getattr(self, k)) is not None}  # fmt: skip
            if given:
                settings = ", ".join(f"{k}={v!r}" for k, v in given.items())
                label = repr(self.policy) if self.name == self.policy else f"{self.name!r} ({self.policy})"
                raise ValueError(
                    f"{name}: policy {label} has no row budget, so {settings} would be ignored (it keeps rows by "
                    "its own rule); leave the budget unset, or use a budgeted policy (streaming, h2o, snapkv, rkv)"
                )
        if self.budget_fraction is not None and not 0 < self.budget_fraction <= 1:
            raise ValueError(f"{name}: budget_fraction must lie in (0, 1], got {self.budget_fraction}")
        if self.budget_fraction is not None and self.budget_match is not None:
            raise ValueError(f"{name}: set budget_fraction or budget_match, not both")
        if self.budget_reference is not None and self.budget_fraction is None:
            raise ValueError(f"{name}: budget_reference is the full-KV run of budget_fraction; set budget_fraction")

    @classmethod
    def evicts_to_budget(cls) -> bool:
        """Whether the policy evicts down to ``budget_rows``: its config declares a default budget (StreamingLLM,
        H2O, SnapKV, R-KV). The others keep rows by their own rule, and refuse a budget they would ignore."""
        import dataclasses

        return next(f for f in dataclasses.fields(cls) if f.name == "budget_rows").default is not None

    @property
    def budget_pending(self) -> bool:
        """A relative budget (fraction / match) not yet turned into ``budget_rows``."""
        return self.budget_fraction is not None or self.budget_match is not None
