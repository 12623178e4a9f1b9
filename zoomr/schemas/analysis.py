"""Schema of analysis tasks (``python -m analysis +task=<name>``): a module of ``analysis/`` and its CLI args."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AnalysisTask:
    name: str = "bench_decode"
    module: str = "bench_decode"  # analysis.<module>.main() runs with sys.argv = [module, *args]
    args: list[str] = field(default_factory=list)


SCHEMAS = [("task", "task", AnalysisTask)]
