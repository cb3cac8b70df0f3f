"""`macspec tune` from start to end: check the inputs, answer, measure, train, save, measure.

Every check the user can fail runs before anything is written; the tuned draft is written
into a staging folder and renamed to `--out` only once it is whole and measured.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load as mlx_load
from mlx_lm.utils import save_model

from macspec.chat.store import default_database_path
from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.catalog import ResolvedModels, resolve_models
from macspec.models.drafters import drafter_kind
from macspec.models.heads import read_config
from macspec.models.home import check_folder_path
from macspec.models.loader import LoadedModels, check_same_tokenizer, load_models
from macspec.models.templates import encode_messages, encode_prompt, has_chat_template
from macspec.text import counted
from macspec.tune import save
from macspec.tune.answers import add_target_logprobs, generate_answers
from macspec.tune.cache import AnswerCache, default_cache_path, target_identity
from macspec.tune.config import (
    QuietReporter,
    Reporter,
    TuneConfig,
    TuneResult,
    format_duration,
    held_out_floor,
)
from macspec.tune.loop import fine_tune
from macspec.tune.measure import Measurement, measure
from macspec.tune.prompts import TunePrompt, read_history, read_prompts, split_held_out
from macspec.tune.train import (
    FULL_FINE_TUNING_MOST,
    TrainSettings,
    fuse,
    parameter_count,
    prepare,
    trainable_parameters,
)

DEFAULT_K = 4
"""Draft length of the measurements when the pair's policy is not a fixed k ('auto' would
make the figures depend on this machine's timings)."""


@dataclass
class _Plan:
    """The checked inputs."""

    resolved: ResolvedModels
    train: list[TunePrompt]
    held_out: list[TunePrompt]
    k: int
    notes: list[str]
    """What the user should know, said once every check has passed."""


def check(config: TuneConfig) -> _Plan:
    """Every check that needs no model weights; writes nothing."""
    notes = []
    if config.prompts is not None and config.from_history:
        raise MacspecError("pass --prompts FILE or --from-history, not both")
    if config.prompts is None and not config.from_history:
        raise MacspecError("no prompts: pass --prompts FILE (JSONL) or --from-history")
    for name, value, least in (
        ("--steps", config.steps, 1),
        ("--eval-every", config.eval_every, 1),
        ("--patience", config.patience, 1),
        ("--lora-rank", config.lora_rank, 1),
        ("--batch-size", config.batch_size, 1),
        ("--max-tokens", config.max_tokens, 1),
        ("--num-draft-tokens", config.k, 1),
        ("--top-k", config.top_k, 1),
    ):
        if value is not None and value < least:
            raise MacspecError(f"{name} must be >= {least}, got {value}")
    if not 0 <= config.kl_weight <= 1:
        raise MacspecError(f"--kl must be between 0 and 1, got {config.kl_weight}")
    if not 0 < config.time_budget_s < math.inf:
        raise MacspecError(f"--time-budget must be longer than 0 s, got {config.time_budget_s}")
    if not 0 <= config.temperature < math.inf:
        raise MacspecError(f"--temp must be a finite number >= 0, got {config.temperature}")
    if config.learning_rate is not None and not 0 < config.learning_rate < math.inf:
        raise MacspecError(
            f"--learning-rate must be a finite number > 0, got {config.learning_rate}"
        )

    if config.cache or config.register is not None:  # said now, not after the answers
        check_folder_path(
            default_cache_path().parent, "the tune answers' folder", "set MACSPEC_HOME elsewhere"
        )

    # The models and --out first: those errors hold whatever the prompts are.
    resolved = resolve_models(config.pair, config.model, config.draft_model)
    if resolved.draft is None:
        raise MacspecError("macspec tune needs a draft model (--draft-model, or a pair with one)")
    if drafter_kind(resolved.draft) != "model":
        raise MacspecError(f"{resolved.draft_name}: only draft models can be tuned (not heads)")
    save.check_out(config.out, config.force, (resolved.target, resolved.draft))
    save.check_disk(config.out, save.needed_bytes(resolved.draft))
    if config.register is not None:
        save.check_register_name(config.register)

    if config.prompts is not None:
        prompts = read_prompts(config.prompts)
    else:
        database = default_database_path()
        prompts, conversations = read_history(database)
        if not prompts:
            raise MacspecError(
                f"--from-history: no stored conversations in {database} "
                "(chat with `macspec chat` first, or pass --prompts FILE)"
            )
        notes.append(
            f"history: {counted(conversations, 'conversation')}, {counted(len(prompts), 'prompt')}"
        )
    if config.held_out is not None:
        held_out = read_prompts(config.held_out, "--held-out")
        keep = {p.messages for p in held_out}
        train = [p for p in prompts if p.messages not in keep]  # never train on held-out ones
        if len(train) < len(prompts):
            repeated = len(prompts) - len(train)
            notes.append(f"{counted(repeated, 'prompt')} also in --held-out: not trained on")
        if not train:
            raise MacspecError("no prompts left to train on: all of them are in --held-out")
    else:
        train, held_out = split_held_out(
            prompts, config.held_out_fraction, config.held_out_most, config.seed
        )

    policy = resolved.pair.draft_policy if resolved.pair is not None else "auto"
    k = config.k or (policy if isinstance(policy, int) else DEFAULT_K)
    return _Plan(resolved, train, held_out, k, notes)


def encode(tokenizer, prompt: TunePrompt) -> list[int]:
    """Prompt ids through the chat template (plain text for a tokenizer without one)."""
    if has_chat_template(tokenizer):
        return encode_messages(tokenizer, prompt.as_messages())
    return encode_prompt(tokenizer, "\n\n".join(c for _, c in prompt.messages), raw=True)


def tune(config: TuneConfig, reporter: Reporter | None = None) -> TuneResult:
    """Check, answer, measure, train, save, measure again; register if asked and better."""
    reporter = reporter or QuietReporter()
    plan = check(config)
    for note in plan.notes:
        reporter.note(note)
    resolved = plan.resolved
    loaded = load_models(resolved.target, resolved.draft, resolved.target_name, resolved.draft_name)
    tokenizer = loaded.tokenizer
    train_ids = [encode(tokenizer, p) for p in plan.train]
    held_ids = [encode(tokenizer, p) for p in plan.held_out]
    reporter.note(
        f"{counted(len(train_ids), 'prompt')} to train on, {len(held_ids)} held out "
        f"({'--held-out' if config.held_out else 'a split never trained on'})"
    )

    cache = None
    if config.cache:
        cache = AnswerCache(default_cache_path(), target_identity(resolved.target))
    try:
        examples = _answers(config, loaded, train_ids, cache, reporter)
        # The held-out loss, which decides when training stops and which weights are kept, is
        # on the target's answers to the held-out prompts (never trained on).
        held_examples = _answers(config, loaded, held_ids, cache, reporter, "held-out ")
    finally:
        if cache is not None:
            cache.close()
            if cache.problem:
                reporter.note(cache.problem)
    answer_tokens = sum(e.answer_length for e in examples)

    figures = dict(
        k=plan.k, max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed
    )
    with reporter.task(f"measuring the draft (k={plan.k})", len(held_ids)) as advance:
        before = _measure(loaded, loaded.draft, held_ids, figures, advance)

    parameters = parameter_count(loaded.draft)
    settings = _settings(config, len(examples), len(held_examples), parameters)
    draft_config = read_config(resolved.draft)
    precision = prepare(loaded.draft, settings)
    trainable = trainable_parameters(loaded.draft)
    method = "full fine-tuning" if settings.full else f"LoRA rank {settings.lora_rank}"
    cap = f"at most {counted(settings.max_steps, 'step')}" if settings.max_steps else "steps"
    reporter.note(
        f"training: {method}{_method_reason(config, parameters)}, {trainable:,} trainable "
        f"parameters, {cap} of batches of {min(settings.batch_size, len(examples))}, learning rate "
        f"{settings.learning_rate:g}"
        + (f", KL weight {settings.kl_weight:g}" if settings.kl_weight else "")
        + f"; until the held-out loss stops improving (checked every "
        f"{counted(settings.eval_every, 'step')}, {counted(settings.patience, 'check')} without "
        f"a gain, not before step {settings.min_steps}: "
        f"{held_out_floor(len(examples), settings.batch_size, settings.max_steps)[1]}) or the "
        "time budget of "
        f"{format_duration(settings.time_budget_s)} runs out (checked between steps); the best "
        "weights are kept"
    )
    with save.staging(config.out, config.force) as folder:
        started = time.perf_counter()
        mx.reset_peak_memory()
        with reporter.training(settings.time_budget_s, settings.max_steps) as show:
            training = fine_tune(loaded.draft, examples, held_examples, settings, show)
        train_s = time.perf_counter() - started
        peak = mx.get_peak_memory()
        tuned = fuse(loaded.draft, precision)
        save.copy_draft_files(resolved.draft, folder, tuned)
        save_model(folder, tuned)
        del tuned
        # The saved folder, loaded as any mlx-lm model is, is what gets measured.
        reloaded, reloaded_tokenizer = mlx_load(str(folder))
        check_same_tokenizer(tokenizer, reloaded_tokenizer, resolved.target_name, str(folder))
        with reporter.task("measuring the tuned draft", len(held_ids)) as advance:
            after = _measure(loaded, reloaded, held_ids, figures, advance)
        identical = before.outputs == after.outputs if config.temperature == 0 else None
        result = TuneResult(
            out=config.out,
            before=before,
            after=after,
            train_prompts=len(train_ids),
            held_out_prompts=len(held_ids),
            answer_tokens=answer_tokens,
            steps=training.steps,
            method=method,
            trainable=trainable,
            draft_parameters=parameters,
            train_s=train_s,
            peak_memory_bytes=peak,
            max_rss_bytes=_max_rss(),
            identical=identical,
            training=training,
            time_budget_s=settings.time_budget_s,
        )
        save.write_record(folder, config, resolved, settings, result, draft_config)

    if config.register is not None:
        if result.better:
            entry = save.pair_entry(
                config.register,
                _portable(resolved.target_name),
                config.out,
                plan.k if resolved.pair is None else resolved.pair.draft_policy,
                _context_length(resolved),
                hub.size_on_disk(resolved.target) + hub.size_on_disk(config.out),
            )
            result.registered = save.register_pair(entry)
        else:
            result.notes.append(
                f"not registered as '{config.register}': the draft is not clearly better"
            )
    return result


def _answers(
    config: TuneConfig, loaded: LoadedModels, prompts, cache, reporter, which: str = ""
) -> list:
    """The target's answers (and top-k log-probabilities when the loss has a KL term), from
    the cache where it kept them; `which` names the prompts ('held-out ')."""
    from_cache = []
    with reporter.task(f"the target's answers to the {which}prompts", len(prompts)) as advance:

        def answered(cached: bool) -> None:
            from_cache.append(cached)
            advance()

        examples = generate_answers(
            loaded.target,
            loaded.tokenizer,
            prompts,
            config.max_tokens,
            config.temperature,
            config.seed,
            advance=answered,
            cache=cache,
        )
    if not examples:
        raise MacspecError(
            f"the target answered none of the {which}prompts (every answer was empty)"
        )
    answer_tokens = sum(e.answer_length for e in examples)
    reused = sum(from_cache)
    kept = f", {reused} kept from an earlier run" if reused else ""
    where = f" (cache: {cache.path}{kept})" if cache is not None and not cache.problem else ""
    answers, tokens = counted(len(examples), f"{which}answer"), counted(answer_tokens, "token")
    reporter.note(f"{answers}, {tokens}{where}")
    if config.kl_weight > 0:
        task = f"the target's log-probabilities on the {which}answers"
        with reporter.task(task, len(examples)) as advance:
            add_target_logprobs(
                loaded.target, examples, config.top_k, loaded.vocab_size, advance, cache
            )
    return examples


def _settings(config: TuneConfig, examples: int, held_out: int, parameters: int) -> TrainSettings:
    """The training settings; full fine-tuning or LoRA as told, else by the draft's size."""
    full = config.full if config.full is not None else parameters <= FULL_FINE_TUNING_MOST
    # A check's forward passes over the held-out batches cost about a third of as many
    # training steps each: every 3 x that many steps keeps checks near a tenth of the time.
    eval_every = config.eval_every or max(5, 3 * math.ceil(held_out / config.batch_size))
    default_lr = 5e-4 if full else 2e-4
    return TrainSettings(
        time_budget_s=config.time_budget_s,
        max_steps=config.steps,
        eval_every=eval_every,
        patience=config.patience,
        min_steps=held_out_floor(examples, config.batch_size, config.steps)[0],
        batch_size=config.batch_size,
        learning_rate=config.learning_rate or default_lr,
        lora_rank=None if full else config.lora_rank,
        kl_weight=config.kl_weight,
        seed=config.seed,
    )


def _method_reason(config: TuneConfig, parameters: int) -> str:
    """Why that method, when the user chose neither: the draft's size against the line."""
    if config.full is not None:
        return ""
    most = f"{FULL_FINE_TUNING_MOST / 1e6:.0f}M"
    size = f"{parameters / 1e6:.2f}M" if parameters < 1e7 else f"{parameters / 1e6:.0f}M"
    if parameters <= FULL_FINE_TUNING_MOST:
        return (
            f" (the default for a draft of {size} parameters, at most {most}: cheap to train "
            "whole; --lora-rank N for LoRA)"
        )
    return f" (the default for a draft of {size} parameters, over {most}; --full to train all)"


def _measure(loaded: LoadedModels, draft, prompts, figures: dict, advance) -> Measurement:
    return measure(
        loaded.target,
        loaded.tokenizer,
        draft,
        prompts,
        figures["k"],
        figures["max_tokens"],
        figures["temperature"],
        figures["seed"],
        vocab_size=loaded.vocab_size,
        advance=advance,
    )


def _portable(name: str) -> str:
    """A target named by a relative folder, as an absolute one (models.toml is read from
    anywhere); repo ids and package specs as they are."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def _context_length(resolved: ResolvedModels) -> int:
    if resolved.pair is not None:
        return resolved.pair.context_length
    config = read_config(resolved.target)
    text = config.get("text_config") or config
    return int(text.get("max_position_embeddings") or 4096)


def _max_rss() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


def iter_lines(result: TuneResult) -> Iterator[str]:
    """The before/after comparison, for the CLI."""
    b, a = result.before, result.after
    yield f"held-out prompts: {result.held_out_prompts}, k = {b.k}"
    yield f"{'':24}{'before':>10}{'after':>10}"
    yield f"{'acceptance':24}{b.acceptance:>10.2f}{a.acceptance:>10.2f}"
    yield f"{'tokens per target pass':24}{b.tokens_per_pass:>10.2f}{a.tokens_per_pass:>10.2f}"
    kept = f"{b.accepted}/{b.proposed}", f"{a.accepted}/{a.proposed}"
    yield f"{'guesses kept':24}{kept[0]:>10}{kept[1]:>10}"
    if b.kept_ends or a.kept_ends:
        yield f"{'  of which answer ends':24}{b.kept_ends:>10}{a.kept_ends:>10}"
        yield "(a kept guess of the answer's end saves no target pass: the target's token after"
        yield " it is dropped; so as many guesses kept can take different numbers of passes)"
