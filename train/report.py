"""End-of-run summary shared by every trainer: now in the library (:mod:`zoomr.rundir`, :mod:`zoomr.training`).

Kept as a re-export for the entry points not yet moved (the testbed recipes); new code imports from zoomr.
"""

from __future__ import annotations

from zoomr.rundir import finish_run, write_summary
from zoomr.training import loss_curve, training_losses

__all__ = ["finish_run", "loss_curve", "training_losses", "write_summary"]
