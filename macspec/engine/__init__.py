"""The guess-and-verify loop and all it needs; imports no other macspec layer."""

from macspec._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "Engine": "loop",
        "GenerationConfig": "loop",
        "Draft": "drafters",
        "Drafter": "drafters",
        "ModelDrafter": "drafters",
        "HybridDrafter": "lookup",
        "LookupDrafter": "lookup",
        "NgramIndex": "lookup",
        "AutoPolicy": "policy",
        "DraftPolicy": "policy",
        "FixedPolicy": "policy",
        "make_policy": "policy",
        "CachedModel": "cached",
        "KeyStream": "sampling",
        "SamplingParams": "sampling",
        "probabilities": "sampling",
        "sample": "sampling",
        "Ema": "stats",
        "Stats": "stats",
        "sources_line": "stats",
        "summary_line": "stats",
        "StopScanner": "stops",
        "Cycle": "cycle",
        "Done": "events",
        "Event": "events",
        "Source": "events",
        "Token": "events",
        "Verdict": "verify",
        "verify_greedy": "verify",
        "verify_sampled": "verify",
    },
)
