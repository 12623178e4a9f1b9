"""``python -m train +method=<name>``: the training entry point.

The chosen method's config names the module that trains it (``method.trainer`` → ``train.<trainer>``),
whose ``run(cfg)`` turns the config into plain objects and calls the library.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: Ctrl-C while they run prints one line, not a traceback
    from zoomr.startup import quiet_while_starting

    quiet_while_starting()

import importlib  # noqa: E402

from zoomr.entry import hydra_entry, require_group, setup_logging  # noqa: E402
from zoomr.tracking import import_hf_wandb_quietly  # noqa: E402


def check_settings(cfg) -> None:
    """A method chosen, and its schema's checks (every trainer converts ``cfg.method`` to it before any run state):
    a ``--multirun`` checks every job with it before any starts."""
    import dataclasses

    from omegaconf import OmegaConf

    from zoomr.schemas import to_dataclass

    require_group(cfg, "method", "train")
    check_deepspeed(cfg)
    if dataclasses.is_dataclass(schema := OmegaConf.get_type(cfg.method)):
        to_dataclass(schema, cfg.method)


def check_trainer_device(cfg) -> None:
    """A ``device=`` the HF Trainer recipes would not train on: it trains on the GPU whenever one is visible and on
    cuda:0 (each torchrun rank on its own), so ``device=cpu`` on a GPU machine trained on the GPU, and ``device=cuda:1``
    on cuda:0, without a word (config.json saying otherwise)."""
    import torch

    device, trainer = str(cfg.get("device") or "auto"), cfg.method.get("trainer")
    if trainer not in DEEPSPEED_TRAINERS or not torch.cuda.is_available():
        return
    if device == "cpu":
        raise SystemExit(f"device=cpu: +method={cfg.method.name} trains with the HF Trainer, which uses the GPU this "
                         "machine has; to train on the CPU hide it (CUDA_VISIBLE_DEVICES= python -m train …)")  # fmt: skip
    if device.startswith("cuda:") and device != "cuda:0":
        raise SystemExit(f"device={device}: +method={cfg.method.name} trains with the HF Trainer, which uses cuda:0; "
                         f"pick the GPU with CUDA_VISIBLE_DEVICES={device.partition(':')[2]} and device=cuda")  # fmt: skip


DEEPSPEED_TRAINERS = ("sft", "zoomr_sft", "abridge", "lightthinker")  # the recipes built on the HF Trainer


def check_deepspeed(cfg) -> None:
    """``deepspeed=zero2|zero3`` with a recipe that trains in its own loop (the KVzap fit, the testbed trainer, the
    AbridgeKV allocation) was accepted and not used: one process without ZeRO, config.json saying zero2."""
    trainer = cfg.method.get("trainer")
    if cfg.deepspeed.get("config") and trainer and trainer not in DEEPSPEED_TRAINERS:
        raise SystemExit(
            f"deepspeed={cfg.deepspeed.name} would be ignored: +method={cfg.method.name} trains in its own loop "
            f"(train/{trainer}.py), not the HF Trainer that runs DeepSpeed ({', '.join(DEEPSPEED_TRAINERS)}); "
            "leave deepspeed=none"
        )


@hydra_entry("train", resumes_from=lambda cfg: cfg.run_dir if cfg.get("resume") == "auto" else None,
             settings=check_settings)  # fmt: skip
def main(cfg) -> None:  # resumes from its checkpoints
    setup_logging()
    require_group(cfg, "method", "train")
    trainer = cfg.method.get("trainer")
    if not trainer:
        raise SystemExit(
            f"method {cfg.method.name!r} has nothing to train (it is a decoding policy): "
            f"evaluate it with `python -m eval +method={cfg.method.name}`"
        )
    check_deepspeed(cfg)
    check_trainer_device(cfg)
    import_hf_wandb_quietly()  # before the HF Trainer's import prints a W&B offline notice (WANDB_MODE=offline)
    importlib.import_module(f"train.{trainer}").run(cfg)


if __name__ == "__main__":
    main()
