"""Preview of what a SLURM submission would contain, without a cluster.

``submitit``'s SLURM executor refuses to start where ``srun`` is missing, but its sbatch text is built
by a pure function; :func:`sbatch_text` maps a composed ``hydra/launcher=slurm_h100`` config onto it
the way hydra-submitit-launcher does (``timeout_min`` → ``--time``, ``mem_gb`` → ``--mem``, …), so users
and tests can check the requested resources before submitting.
"""

from __future__ import annotations

from typing import Any

_SKIP = {"_target_", "submitit_folder", "name", "stderr_to_stdout", "array_parallelism", "max_num_timeout",
         "signal_delay_s", "timeout_min", "tasks_per_node", "mem_gb", "setup"}


def sbatch_text(launcher: dict[str, Any], command: str, folder: str, job_name: str = "zoomr") -> str:
    """The sbatch script submitit would write for ``launcher`` (a resolved slurm launcher config)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params: dict[str, Any] = {k: v for k, v in launcher.items() if k not in _SKIP and v is not None}
    params["time"] = int(launcher["timeout_min"])
    params["ntasks_per_node"] = int(launcher.get("tasks_per_node", 1))
    if launcher.get("mem_gb") is not None:
        params["mem"] = f"{int(launcher['mem_gb'])}GB"
    if launcher.get("setup"):
        params["setup"] = list(launcher["setup"])
    params["signal_delay_s"] = int(launcher.get("signal_delay_s", 90))
    if not params.get("additional_parameters"):
        params.pop("additional_parameters", None)
    return _make_sbatch_string(command=command, folder=folder, job_name=job_name, **params)
