"""`macspec tune`'s measurement: where a target pass goes when a kept guess is the answer's end."""

from __future__ import annotations

from pathlib import Path

import pytest
from chatkit import printable, tiny_tokenizer
from tiny import random_model

from macspec.tune.config import TuneResult
from macspec.tune.measure import measure
from macspec.tune.run import iter_lines

PROMPTS = ("hello there", "the cat sat", "a big dog", "red fox ran")


@pytest.fixture(scope="module")
def ends(tmp_path_factory):
    """A target that ends its answers within a few tokens, measured with two drafts that agree
    with it on every token: itself (it guesses the ends too) and a copy that never guesses an
    end (the target then chooses each end as its own token)."""
    tok = tiny_tokenizer(Path(tmp_path_factory.mktemp("tok")))
    base = random_model(0, scale=3.0)
    target = printable(base, tok, eos_bias=2.0)
    blind = printable(base, tok, eos_bias=-1e4)
    prompts = [tok.encode(text) for text in PROMPTS]
    guesses_ends = measure(target, tok, target, prompts, k=4, max_tokens=24)
    never_ends = measure(target, tok, blind, prompts, k=4, max_tokens=24)
    return guesses_ends, never_ends


def test_a_kept_guess_of_the_end_is_counted_and_saves_no_pass(ends):
    """Both drafts give the same answers in the same target passes, yet one keeps a guess
    more per answer: its guesses of the ends, which save no pass (the target's token after an
    end is dropped). Tune counts them apart, so the same guesses kept with another number of
    passes, or the reverse, is explained rather than a puzzle."""
    guesses_ends, never_ends = ends
    assert guesses_ends.outputs == never_ends.outputs
    assert all(len(output) < 24 for output in guesses_ends.outputs)  # every answer ended
    assert guesses_ends.per_prompt == never_ends.per_prompt  # tokens and passes alike
    assert guesses_ends.kept_ends == len(PROMPTS) and never_ends.kept_ends == 0
    assert guesses_ends.accepted == never_ends.accepted + len(PROMPTS)
    # Every other kept guess saves a pass: tokens + the end = kept guesses + passes - kept ends.
    for m in ends:
        assert m.generated + len(PROMPTS) == m.accepted + m.passes - m.kept_ends


def test_the_before_and_after_table_says_which_kept_guesses_were_ends(ends):
    guesses_ends, never_ends = ends
    result = TuneResult(
        Path("out"), never_ends, guesses_ends, 1, len(PROMPTS), 1, 1, "full", 1, 0.0,
        0, 0, True,
    )  # fmt: skip
    lines = list(iter_lines(result))
    assert f"{'  of which answer ends':24}{0:>10}{len(PROMPTS):>10}" in lines
    assert any("saves no target pass" in line for line in lines)
    # Without a kept end on either side, the table has no such row.
    plain = TuneResult(
        Path("out"), never_ends, never_ends, 1, len(PROMPTS), 1, 1, "full", 1, 0.0,
        0, 0, True,
    )  # fmt: skip
    assert not any("answer ends" in line for line in iter_lines(plain))
