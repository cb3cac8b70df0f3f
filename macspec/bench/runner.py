"""Running `macspec bench`: every configuration over the same loaded models and prompt ids.

Each run is timed from the outside the same way whatever the tool (a wall clock around the
whole generation, the arrival of each id counted here), and runs are interleaved prompt by
prompt with the configurations in rotating order, so drift of a shared machine hits all alike.
The figures are computed from the records by bench/figures.py and bench/theory.py; what runs,
and in which order, is planned by bench/plan.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import mlx.core as mx
import mlx.nn as nn
from mlx_lm import stream_generate
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from macspec.bench.cost import CostSampler
from macspec.bench.figures import (
    MACSPEC,
    BenchConfig,
    RunRecord,
    replay_mlx_cycles,
)
from macspec.bench.lossless import Comparison, lossless_checks

# re-exported: what the bench runs is planned in bench/plan.py
from macspec.bench.plan import BenchSettings, plan_configs, run_seed, schedule  # noqa: E402,F401
from macspec.bench.theory import CostCurve
from macspec.bench.waits import WaitCounter
from macspec.engine.core.events import Cycle, Done, Token
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.distributed import DistributedEngine
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import DraftPolicy, make_policy
from macspec.engine.trees.sizing import make_tree_policy
from macspec.errors import MacspecError
from macspec.models.build import make_drafter
from macspec.models.loader import LoadedModels


class Runner:
    """Runs one configuration on one prompt over models loaded once.

    With an mlx.distributed `group` (a target sharded over its ranks) every rank runs the same
    schedule, and each macspec engine is a `DistributedEngine`: the ranks agree on every k.
    """

    def __init__(self, loaded: LoadedModels, settings: BenchSettings, group=None, watchdog=None):
        self.loaded = loaded
        self.settings = settings
        self.group = group
        self.watchdog = watchdog
        self.mlx_lm_speculates = loaded.draft is not None and all(
            can_trim_prompt_cache(make_prompt_cache(m)) for m in (loaded.target, loaded.draft)
        )
        """mlx-lm speculates only with a draft model, where it can trim both caches."""
        self._warm_policies: dict[BenchConfig, DraftPolicy] = {}
        """'auto-warm' policies, one per configuration, kept from run to run."""

    def run(
        self,
        config: BenchConfig,
        prompt_ids: list[int],
        prompt: int,
        repeat: int,
        max_tokens: int | None = None,
    ) -> RunRecord:
        max_tokens = max_tokens or self.settings.max_tokens
        context = self.settings.context_length
        if context is not None and config.tool != MACSPEC:  # mlx-lm would run past it
            max_tokens = min(max_tokens, context - len(prompt_ids))
        seed = run_seed(self.settings, prompt, repeat)
        mx.clear_cache()
        mx.reset_peak_memory()
        go = self._macspec if config.tool == MACSPEC else self._mlx
        models = [self.loaded.target, self.loaded.draft, *self.loaded.heads.values()]
        with WaitCounter(models) as waits:
            record = go(config, prompt_ids, max_tokens, seed, waits)
        return replace(
            record,
            prompt=prompt,
            repeat=repeat,
            peak_memory_bytes=int(mx.get_peak_memory()),
            waits=waits.count - waits.at_first_token,
        )

    def _macspec(
        self, config: BenchConfig, prompt_ids: list[int], max_tokens: int, seed: int, waits
    ) -> RunRecord:
        loaded = self.loaded
        sampling = SamplingParams(temperature=config.temperature, top_p=self.settings.top_p)
        generation = GenerationConfig(
            max_tokens=max_tokens,
            sampling=sampling,
            seed=seed,
            sampler=config.sampler,
            context_length=self.settings.context_length,
        )
        arrivals: list[float] = []
        passes = proposed = accepted = rejections = first_pass = fed = refed = 0
        done = None
        started = time.perf_counter()
        # A fresh engine per run, as stream_generate makes fresh caches: no reuse between runs.
        drafter, policy = None, None
        if config.draft is not None:
            source = config.source or self.settings.draft_source
            drafter = make_drafter(source, loaded, self.settings.cache_options)
            if config.draft == "auto-warm":
                policy = self._warm_policies.setdefault(config, make_policy("auto"))
            else:
                policy = make_policy(config.draft)
            policy = make_tree_policy(config.tree, policy)
        engine = Engine(
            loaded.target,
            loaded.tokenizer,
            drafter,
            policy,
            loaded.vocab_size,
            self.settings.cache_options,
        )
        if self.group is not None:
            engine = DistributedEngine(engine, self.group, self.watchdog)
        for event in engine.generate(prompt_ids, generation):
            if isinstance(event, Token):
                if not arrivals:
                    waits.first_token()
                arrivals.append(time.perf_counter() - started)
                first_pass += passes == 1
            elif isinstance(event, Cycle):
                passes += 1
                proposed += event.proposed
                accepted += event.accepted
                rejections += event.accepted < event.proposed
                fed += event.fed
                refed += event.refed
            elif isinstance(event, Done):
                done = event
        elapsed = time.perf_counter() - started
        assert done is not None
        return RunRecord(
            config,
            0,
            0,
            tuple(done.tokens),
            done.finish_reason,
            tuple(arrivals),
            elapsed,
            first_pass,
            passes,
            proposed,
            accepted,
            rejections,
            fed=fed,
            refed=refed,
        )

    def _mlx(
        self, config: BenchConfig, prompt_ids: list[int], max_tokens: int, seed: int, waits
    ) -> RunRecord:
        loaded = self.loaded
        top_p = self.settings.top_p if self.settings.top_p < 1 else 0.0  # mlx-lm: 0 is off
        caches = self.settings.cache_options
        kwargs = {
            "max_tokens": max_tokens,
            "sampler": make_sampler(config.temperature, top_p),
            "kv_bits": caches.kv_bits,
            "kv_group_size": caches.kv_group_size,
            "quantized_kv_start": caches.quantized_kv_start,
        }
        if caches.max_kv_size is not None:  # mlx-lm speculates with no max_kv_size at all
            kwargs["max_kv_size"] = caches.max_kv_size
        k = config.k or 0
        if config.draft is not None:
            kwargs.update(draft_model=loaded.draft, num_draft_tokens=k)
        mx.random.seed(seed)  # mlx-lm samples from MLX's global generator
        tokens: list[int] = []
        flags: list[bool] = []
        arrivals: list[float] = []
        finish = "length"
        started = time.perf_counter()
        for response in stream_generate(loaded.target, loaded.tokenizer, prompt_ids, **kwargs):
            flags.append(bool(response.from_draft))
            if response.finish_reason == "stop":  # it carries the end-of-sequence id
                finish = "stop"
                continue
            if not arrivals:
                waits.first_token()
            arrivals.append(time.perf_counter() - started)
            tokens.append(int(response.token))
        elapsed = time.perf_counter() - started
        cycles = replay_mlx_cycles(flags, k, max_tokens, len(tokens))
        return RunRecord(
            config,
            0,
            0,
            tuple(tokens),
            finish,
            tuple(arrivals),
            elapsed,
            cycles.first_pass_tokens,
            cycles.passes,
            cycles.proposed,
            cycles.accepted,
            cycles.rejections,
        )


def argmax_margin(model: nn.Module, ids: Sequence[int], vocab_size: int | None = None) -> float:
    """Top-1 minus top-2 logit of the model's next-token prediction after `ids`."""
    logits = model(mx.array(list(ids), mx.uint32)[None])[0, -1, :vocab_size].astype(mx.float32)
    top = mx.sort(logits)[-2:].tolist()
    return top[1] - top[0]


@dataclass
class BenchResult:
    """Everything a benchmark measured."""

    settings: BenchSettings
    configs: list[BenchConfig]
    prompt_ids: list[list[int]]
    """The ids every configuration got, per prompt (chat template applied)."""
    records: list[RunRecord] = field(default_factory=list)
    curve: CostCurve | None = None
    checks: list[Comparison] = field(default_factory=list)
    """Greedy outputs against their references (with the argmax margin at differences)."""
    seconds: float = 0.0


Progress = Callable[[int, int, str], None]
"""progress(done, total, what is running now)."""


def run_bench(
    loaded: LoadedModels,
    prompt_ids: list[list[int]],
    settings: BenchSettings,
    progress: Progress | None = None,
    group=None,
    watchdog=None,
) -> BenchResult:
    """Warm up, measure the cost curve, run the schedule, check losslessness. With an
    mlx.distributed `group`, every rank calls this alike (the target sharded over them)."""
    started = time.perf_counter()
    if group is not None and group.size() != settings.ranks:
        raise MacspecError(f"settings for {settings.ranks} rank(s), a group of {group.size()}")
    runner = Runner(loaded, settings, group, watchdog)
    configs = plan_configs(settings, runner.mlx_lm_speculates)
    result = BenchResult(settings, configs, prompt_ids)
    order = schedule(configs, len(prompt_ids), settings.repeats)
    total = len(order) + 1 + (len(configs) if settings.warmup else 0)
    done = 0

    def step(what: str) -> None:
        if watchdog is not None:  # the cost curve's passes show progress too
            watchdog.kick()
        if progress is not None:
            progress(done, total, what)

    if settings.warmup:
        for config in configs:
            step(f"warm-up {config.label}")
            runner.run(config, prompt_ids[0], 0, 0, max_tokens=min(8, settings.max_tokens))
            done += 1
    step("verify-cost curve")
    sampler = CostSampler(loaded.target, loaded.draft, prompt_ids[0], settings.curve_max_m)
    done += 1
    for n, (repeat, prompt, config) in enumerate(order):
        if n % len(configs) == 0:
            sampler.round()  # one round of the cost curve before each prompt
        step(f"prompt {prompt + 1}/{len(prompt_ids)} {config.label}")
        result.records.append(runner.run(config, prompt_ids[prompt], prompt, repeat))
        done += 1
    while sampler.rounds < settings.curve_repeats:
        step("verify-cost curve")
        sampler.round()
    result.curve = sampler.curve()
    step("checking outputs")
    result.checks = [
        _with_margin(loaded, prompt_ids, c, result.records) for c in lossless_checks(result.records)
    ]
    result.seconds = time.perf_counter() - started
    step("done")
    return result


def _with_margin(
    loaded: LoadedModels, prompt_ids: list[list[int]], check: Comparison, records
) -> Comparison:
    if check.identical:
        return check
    reference = next(
        r
        for r in records
        if (r.config, r.prompt, r.repeat) == (check.reference, check.prompt, check.repeat)
    )
    context = prompt_ids[check.prompt] + list(reference.tokens[: check.position])
    return replace(check, margin=argmax_margin(loaded.target, context, loaded.vocab_size))
