"""A qwen35 GGUF file (tests/oraclekit.py's tiny Qwen3.5: Gated DeltaNet, full attention, an MTP
layer; llama.cpp's answer on it is tests/fixtures/llamacpp/qwen35.json) keeps macspec's hybrid
cache rollback: drafted runs are the target's own greedy answer, and the MTP layer the file
carries is named as not used."""

from __future__ import annotations

import pytest
from oraclekit import rebuilt, write_tiny_gguf

from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models import hub
from macspec.models.build import build_engine, make_drafter
from macspec.models.gguf.archs import notices
from macspec.models.gguf.header import read_header
from macspec.models.resolved import ResolvedModels

MAX_TOKENS = 12
PROMPT = [9707, 11, 1879, 0, 358, 1079, 264, 1273, 9707, 11, 1879, 0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny qwen35 file as `--model`, drafted for by another qwen35 file (other weights:
    most drafts rejected, so the recurrent state is rolled back on most passes)."""
    folder = tmp_path_factory.mktemp("qwen35")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(folder / "home"))
        target = rebuilt("qwen35", folder)
        other = write_tiny_gguf("qwen35", tmp_path_factory.mktemp("draft"), seed=11)
        resolved = ResolvedModels(
            hub.local_model_path(str(target)),
            hub.local_model_path(str(other)),
            str(target),
            str(other),
            None,
        )
        _, loaded = build_engine(resolved)
        yield target, loaded


def answer(loaded, drafter) -> tuple[list[int], object]:
    engine = Engine(loaded.target, loaded.tokenizer, drafter, FixedPolicy(3) if drafter else None)
    done = list(engine.generate(PROMPT, GenerationConfig(max_tokens=MAX_TOKENS)))[-1]
    return done.tokens, done.stats


@pytest.mark.parametrize("kind", ["model", "lookup"])
def test_drafted_greedy_is_the_targets_own(models, kind):
    _, loaded = models
    plain, _ = answer(loaded, None)
    drafted, stats = answer(loaded, make_drafter(kind, loaded))
    assert len(plain) == MAX_TOKENS and drafted == plain
    if kind == "model":  # drafts were proposed, and some rolled back
        assert 0 < stats.draft_proposed and stats.draft_accepted < stats.draft_proposed


def test_the_mtp_layer_is_named_as_not_used(models):
    target, _ = models
    assert any("MTP" in line for line in notices(read_header(target)))
