"""`macspec bench`: side-by-side runs, their figures, theory, cost sampler, prompt sets."""

from macspec._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "BenchResult": "runner",
        "BenchSettings": "runner",
        "run_bench": "runner",
        "Report": "report",
        "report": "report",
        "BenchConfig": "figures",
        "RunRecord": "figures",
        "CostCurve": "theory",
        "BenchPrompt": "prompts",
        "builtin": "prompts",
        "load_prompts": "prompts",
    },
)
