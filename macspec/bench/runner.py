"""Running `macspec bench`: every configuration over the same loaded models and prompt ids.

Each run is timed from the outside the same way whatever the tool (a wall clock around the
whole generation, the arrival of each id counted here), and runs are interleaved prompt by
prompt with the configurations in rotating order, so drift of a shared machine hits all alike.
The figures are computed from the records by macspec/bench.py and bench_theory.py.
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
    MLX_LM,
    BenchConfig,
    Comparison,
    RunRecord,
    lossless_checks,
    replay_mlx_cycles,
)
from macspec.bench.theory import CostCurve
from macspec.bench.waits import WaitCounter
from macspec.engine.cached import DEFAULT_CACHE, CacheOptions
from macspec.engine.distributed import DistributedEngine
from macspec.engine.events import Cycle, Done, Token
from macspec.engine.loop import Engine, GenerationConfig
from macspec.engine.policy import DraftPolicy, make_policy
from macspec.engine.sampling import SamplingParams
from macspec.errors import MacspecError
from macspec.models.build import make_drafter
from macspec.models.flags import check_draft_source
from macspec.models.loader import LoadedModels


@dataclass(frozen=True)
class BenchSettings:
    """What to run."""

    max_tokens: int = 128
    """Most ids per generation (every tool also stops at end of sequence)."""
    temperature: float = 0.7
    """The sampling temperature; every configuration also runs greedy (T=0)."""
    top_p: float = 1.0
    """Nucleus mass for the sampled runs (1 = off)."""
    ks: tuple[int, ...] = (2, 3, 4)
    """Fixed draft lengths to run, for macspec and mlx-lm alike."""
    auto: bool = True
    """Also run macspec with the adaptive draft length, a fresh policy per run."""
    auto_warm: bool = True
    """And with one adaptive policy kept across runs (what a chat session's engine learns)."""
    repeats: int = 1
    """Passes over the whole prompt set."""
    seed: int = 0
    """Seeds of the sampled runs derive from it (the same per prompt for every tool)."""
    curve_max_m: int = 16
    """The verify-cost curve times target passes over m = 1 .. curve_max_m ids."""
    curve_repeats: int = 7
    """Fewest timings per m (one is taken before each prompt; more at the end if short);
    the curve keeps their median."""
    warmup: bool = True
    """Run every configuration once, untimed, on a few ids before measuring."""
    draft_source: str = "model"
    """Where macspec's guesses come from ('model', 'lookup', 'hybrid', 'mtp', 'dflash');
    mlx-lm's are always its draft model's. The cost curve times a draft step and a lookup."""
    context_length: int | None = None
    """The target's context window: every tool stops there (macspec says 'context'), so
    their outputs stay comparable. None: no limit."""
    cache_options: CacheOptions = DEFAULT_CACHE
    """KV cache quantization and size, for macspec and mlx-lm alike."""
    more_sources: tuple[str, ...] = ()
    """Other drafters macspec also runs, at the same k and auto, side by side."""
    ranks: int = 1
    """Ranks the target is sharded over (mlx.launch). Above 1, macspec's rows only: mlx-lm's
    decoding cannot run on a sharded target; macspec plain is the baseline."""

    def __post_init__(self) -> None:
        if self.max_tokens < 2:
            raise MacspecError(f"--max-tokens must be >= 2 for a benchmark, got {self.max_tokens}")
        if self.repeats < 1:
            raise MacspecError(f"--repeats must be >= 1, got {self.repeats}")
        if not self.temperature > 0:
            raise MacspecError(
                f"--temp is the sampling temperature and must be > 0 (T=0 always runs), "
                f"got {self.temperature}"
            )
        if not self.ks or any(k < 1 for k in self.ks):
            raise MacspecError(f"--k needs positive draft lengths, got {list(self.ks)}")
        for source in (self.draft_source, *self.more_sources):
            check_draft_source(source)
            if source == "auto":
                raise MacspecError("--draft auto is not a bench source; list the drafters")
        if self.curve_max_m < max(self.ks) + 1:
            raise MacspecError("the cost curve must reach k + 1 ids for every k")


def plan_configs(settings: BenchSettings, mlx_lm_speculates: bool = True) -> list[BenchConfig]:
    """The configurations, greedy first: plain (both tools), mlx-lm at each k, macspec too.

    mlx-lm's speculative rows are left out where it refuses to speculate (a target or draft
    whose cache it cannot trim: hybrid, recurrent, a sliding window), and all of them on a
    target sharded over several ranks.
    """
    configs = []
    mlx_lm = settings.ranks == 1
    for temp in (0.0, settings.temperature):
        configs.append(BenchConfig(MACSPEC, None, temp))
        if mlx_lm:
            configs.append(BenchConfig(MLX_LM, None, temp))
        if mlx_lm and mlx_lm_speculates:
            configs += [BenchConfig(MLX_LM, str(k), temp) for k in settings.ks]
        configs += [BenchConfig(MACSPEC, str(k), temp) for k in settings.ks]
        if settings.auto:
            configs.append(BenchConfig(MACSPEC, "auto", temp))
        if settings.auto_warm:
            configs.append(BenchConfig(MACSPEC, "auto-warm", temp))
        for source in settings.more_sources:  # every other drafter, side by side
            configs += [BenchConfig(MACSPEC, str(k), temp, source) for k in settings.ks]
            if settings.auto:
                configs.append(BenchConfig(MACSPEC, "auto", temp, source))
        if temp > 0:  # the rejection rule beside the coupled one: acceptance compared
            configs += [
                BenchConfig(MACSPEC, str(k), temp, sampler="rejection") for k in settings.ks
            ]
    return configs


def schedule(
    configs: Sequence[BenchConfig], prompts: int, repeats: int
) -> list[tuple[int, int, BenchConfig]]:
    """(repeat, prompt, config) in run order: prompt by prompt, the configurations rotated
    by one place at each prompt so none always runs first (on a cold cache) or last."""
    order = []
    for repeat in range(repeats):
        for prompt in range(prompts):
            shift = (repeat * prompts + prompt) % len(configs)
            order += [(repeat, prompt, c) for c in [*configs[shift:], *configs[:shift]]]
    return order


def run_seed(settings: BenchSettings, prompt: int, repeat: int) -> int:
    return settings.seed + 1000 * repeat + prompt


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
