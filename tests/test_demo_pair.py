"""The shipped demo pair (macspec/demo): mlx-lm loads it, 4-bit, one tokenizer, sane greedy output.

The pair is trained by scripts/train/train_demo_pair.py; the prompts are its held-out split.
"""

import json
from importlib.resources import files
from pathlib import Path

import pytest

mlx_lm = pytest.importorskip("mlx_lm")
mx = pytest.importorskip("mlx.core")

PROMPTS = Path(__file__).parents[1] / "scripts" / "demo_eval_prompts.jsonl"


def demo_path(name: str) -> Path:
    return Path(str(files("macspec") / "demo" / name))


@pytest.fixture(scope="module")
def pair():
    target = mlx_lm.load(str(demo_path("target")))
    draft = mlx_lm.load(str(demo_path("draft")))
    return target, draft


@pytest.fixture(scope="module")
def prompts():
    with open(PROMPTS) as f:
        return [json.loads(line)["prompt"] for line in f][:3]


def target_alone(model, tokenizer, ids: list[int], max_tokens: int) -> list[int]:
    """mlx-lm's own greedy decoding of the target alone, cut at (and without) the EOS."""
    from mlx_lm.generate import generate_step

    out = []
    for token, _ in generate_step(mx.array(ids), model, max_tokens=max_tokens):
        if token == tokenizer.eos_token_id:
            break
        out.append(token)
    return out


def chat_ids(tokenizer, prompt: str) -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )


@pytest.mark.parametrize("name", ["target", "draft", "draft-tuned"])
def test_shipped_files_are_4bit_llama(name):
    path = demo_path(name)
    shipped = {p.name for p in path.iterdir()}
    needed = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert needed <= shipped
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["quantization"]["bits"] == 4
    assert config["quantization"]["group_size"] == 64


def test_draft_is_much_smaller(pair):
    (target, _), (draft, _) = pair
    t_args, d_args = target.args, draft.args
    assert d_args.hidden_size < t_args.hidden_size
    assert d_args.num_hidden_layers < t_args.num_hidden_layers
    size = lambda p: (p / "model.safetensors").stat().st_size  # noqa: E731
    assert size(demo_path("target")) > 3 * size(demo_path("draft"))


def test_one_tokenizer(pair):
    (_, t_tok), (_, d_tok) = pair
    assert t_tok.get_vocab() == d_tok.get_vocab()
    assert t_tok.eos_token_id == d_tok.eos_token_id == t_tok.convert_tokens_to_ids("<|end|>")


def test_chat_template_applies(pair, prompts):
    (_, tok), _ = pair
    messages = [{"role": "user", "content": prompts[0]}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == f"<|begin|><|user|>\n{prompts[0]}<|end|><|assistant|>\n"
    ids = chat_ids(tok, prompts[0])
    assert ids[:2] == tok.convert_tokens_to_ids(["<|begin|>", "<|user|>"])
    assert tok.decode(ids[-2:]) == "<|assistant|>\n"
    # without the generation prompt the template ends the last turn instead
    no_gen = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert no_gen.endswith("<|end|>")


def test_target_greedy_is_deterministic_python(pair, prompts):
    (model, tok), _ = pair
    for prompt in prompts:
        ids = chat_ids(tok, prompt)
        first = mlx_lm.generate(model, tok, ids, max_tokens=40)
        second = mlx_lm.generate(model, tok, ids, max_tokens=40)
        assert first == second
        assert first.strip()
        assert first.startswith(("def ", "async def ")), first


def test_lookup_drafting_on_the_demo_target_is_lossless(pair):
    """Prompt lookup on the real 4-bit target, on the bench's edit-this-code prompts: the same
    ids as mlx-lm's target-only decoding, with some of lookup's guesses kept."""
    from macspec.bench.prompts import GROUNDED
    from macspec.engine.core.events import Done
    from macspec.engine.drafters.lookup import LookupDrafter
    from macspec.engine.generate.loop import Engine, GenerationConfig
    from macspec.engine.policy.length import FixedPolicy

    (model, tok), _ = pair
    engine = Engine(model, tok, LookupDrafter(), FixedPolicy(4))
    kept = 0
    for prompt in [p.text for p in GROUNDED if p.category == "edit"]:
        ids = chat_ids(tok, prompt)
        config = GenerationConfig(max_tokens=96)
        done = next(e for e in engine.generate(ids, config) if isinstance(e, Done))
        assert done.tokens == target_alone(model, tok, ids, 96)
        kept += done.stats.by_source["lookup"][1]
    assert kept > 0


def test_the_tuned_draft_shares_the_tokenizer_and_stays_lossless(pair, prompts):
    """The demo-tuned pair's draft (made by `macspec tune`, see macspec/demo/README.md): the
    same tokenizer files as the target's, guesses kept, and speculative output that is
    mlx-lm's target-only greedy output token for token."""
    from macspec.engine.core.events import Done
    from macspec.engine.drafters.model import ModelDrafter
    from macspec.engine.generate.loop import Engine, GenerationConfig
    from macspec.engine.policy.length import FixedPolicy

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        tuned = (demo_path("draft-tuned") / name).read_bytes()
        assert tuned == (demo_path("target") / name).read_bytes()
    record = json.loads((demo_path("draft-tuned") / "tune.json").read_text())
    assert record["verdict"] == "better" and record["identical_greedy_outputs"]
    (model, tok), _ = pair
    draft, _ = mlx_lm.load(str(demo_path("draft-tuned")))
    engine = Engine(model, tok, ModelDrafter(draft), FixedPolicy(4))
    kept = 0
    for prompt in prompts:
        ids = chat_ids(tok, prompt)
        config = GenerationConfig(max_tokens=64)
        done = next(e for e in engine.generate(ids, config) if isinstance(e, Done))
        assert done.tokens == target_alone(model, tok, ids, 64)
        kept += done.stats.draft_accepted
    assert kept > 0


def test_plain_run_drafts_with_the_tuned_draft_at_draft_length_auto(capsys):
    """What README's opening says plain `run` does, it does: the demo pair's first draft model
    (the tuned one), the draft length `-k auto` of the pair's policy, and no `--draft auto`
    (no drafter choice in its stats)."""
    from macspec.cli import main

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    opening = " ".join(readme.split("## What it does")[0].split())
    assert (
        "Plain `run` drafts with the pair's draft model at the draft length `-k auto` "
        "(`--num-draft-tokens auto`, the pair's `draft_policy`; not `--draft auto`"
    ) in opening
    assert main(["run", "--json", "--max-tokens", "12", "def keys(self):"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["drafter"] == "model" and record["draft_model"] == "demo/draft-tuned"
    assert record["stats"]["drafter_choice"] is None
    from macspec.engine.policy.length import AutoPolicy
    from macspec.models.build import build_engine
    from macspec.models.catalog import resolve_models

    engine, _ = build_engine(resolve_models(None, None, None))  # what plain `run` builds
    assert isinstance(engine.policy, AutoPolicy) and engine.drafter.name == "model"
