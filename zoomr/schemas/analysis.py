"""Schema of analysis tasks (``python -m analysis +task=<name>``): a module of ``analysis/`` and its CLI args."""

from __future__ import annotations

from dataclasses import dataclass, field

from zoomr.schemas.checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check_fields


@dataclass
class AnalysisTask:
    name: str = "bench_decode"
    module: str = "bench_decode"  # analysis.<module>.main() runs with sys.argv = [module, *args]
    args: list[str] = field(default_factory=list)


@dataclass
class PaperTablesTask(AnalysisTask):
    """``+task=paper_tables``: every paper's tables and figures from run directories (analysis/paper_tables/)."""

    name: str = "paper_tables"
    module: str = "paper_tables"
    runs: list[str] = field(default_factory=list)  # run directories, JSON files or globs (``**`` recurses)
    out: str = "runs/analysis/paper_tables"
    memory_gib: float = 8.0  # Figure 3c: KV memory that the sequences must fit in
    n_resamples: int = 2000  # paired bootstrap of the Δ columns (eval.compare)
    seed: int = 1234
    allow_different_settings: bool = False  # tabulate arms whose fingerprints differ (eval.compare lists how)

    def __post_init__(self) -> None:
        check_fields(self, "task", memory_gib=POSITIVE, n_resamples=AT_LEAST_ONE, seed=NON_NEGATIVE)


@dataclass
class MiniatureTask(AnalysisTask):
    """``+task=miniature``: every method and baseline on the CPU recall testbed (analysis/miniature.py)."""

    name: str = "miniature"
    module: str = "miniature"
    arms: list[str] = field(default_factory=list)  # empty: every default arm; [all]: the variants too (miniature_plan.ARMS)
    n: int = 256  # test problems, the same for every arm
    test_seed: int = 2_000_003  # held out: training streams use seed 0 (testbed data.seed)
    trace_tokens: int = 1024
    out: str = "runs/miniature"
    batch_size: int = 64  # sequences decoded together
    threads: int = 2  # OMP threads of every train subprocess, shared by the arms' lanes
    arm_lanes: int = 2  # eval arms run side by side, threads // arm_lanes each (1: one after another)
    n_resamples: int = 2000
    dry_run: bool = False  # print the commands it would run, run nothing
    # false: train nothing; arms evaluate the checkpoints already under runs/train, and a finished arm directory of
    # the same command is reused without its checkpoint (e.g. the committed slim copies: the table from run dirs)
    train: bool = True

    def __post_init__(self) -> None:
        if (
            self.n < 2
            or self.trace_tokens < 64
            or self.batch_size < 1
            or self.threads < 1
            or self.arm_lanes < 1
            or self.n_resamples < 1
        ):
            raise ValueError(
                "MiniatureTask: need n >= 2, trace_tokens >= 64, batch_size >= 1, threads >= 1, arm_lanes >= 1, "
                f"n_resamples >= 1; got n={self.n}, trace_tokens={self.trace_tokens}, batch_size={self.batch_size}, "
                f"threads={self.threads}, arm_lanes={self.arm_lanes}, n_resamples={self.n_resamples}"
            )


SCHEMAS = [
    ("task", "task", AnalysisTask),
    ("task", "paper_tables", PaperTablesTask),
    ("task", "miniature", MiniatureTask),
]
