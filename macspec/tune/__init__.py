"""Draft distillation: the target's answers -> mlx-lm's tuner -> a saved, measured draft."""

from macspec._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "TuneConfig": "config",
        "TuneResult": "config",
        "tune": "run",
        "TunePrompt": "prompts",
        "read_prompts": "prompts",
        "Measurement": "measure",
        "measure": "measure",
        "TrainSettings": "train",
    },
)
