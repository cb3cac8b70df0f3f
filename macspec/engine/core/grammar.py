"""A grammar's mask on the target (and so on what its guesses may be), through llguidance.

`Grammar` says what the answer must match: a JSON schema, any JSON value, a regex or a Lark
grammar. `Constraint` is one generation's matcher: it says which ids may come next, which
guesses fit, which ids the grammar forces, and it follows the ids the answer keeps. The loop
sees masks and ids only, nothing of grammars.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from macspec.errors import MacspecError

if TYPE_CHECKING:  # llguidance loads when a grammar is first compiled
    from llguidance import LLTokenizer

KINDS = ("json_schema", "json", "regex", "lark")
MAX_GRAMMAR_BYTES = 256 * 1024
"""A grammar's source larger than this is refused up front (llguidance's own limits bound
what it compiles; this bounds what a request can make the server parse)."""

_tokenizers: weakref.WeakKeyDictionary[Any, LLTokenizer] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Grammar:
    """What an answer must match."""

    kind: str
    """'json_schema', 'json' (any JSON object), 'regex' or 'lark'."""
    source: str = ""
    """The schema (JSON text), the regex or the Lark grammar; empty for 'json'."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise MacspecError(f"a grammar is one of {', '.join(KINDS)}, not {self.kind!r}")
        if len(self.source.encode()) > MAX_GRAMMAR_BYTES:
            raise MacspecError(
                f"the {self.kind} is {len(self.source.encode()):,} bytes; at most "
                f"{MAX_GRAMMAR_BYTES:,} are accepted"
            )

    @classmethod
    def json_schema(cls, schema: dict | str) -> Grammar:
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema))

    def compiled(self) -> str:
        """llguidance's grammar text."""
        from llguidance import LLMatcher

        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        if self.kind == "lark":
            return LLMatcher.grammar_from_lark(self.source)
        if self.kind == "json":
            schema: Any = {"type": "object"}
        else:
            try:
                schema = json.loads(self.source)
            except ValueError as exc:
                raise MacspecError(f"the JSON schema is not JSON ({exc})") from None
            if not isinstance(schema, dict):
                raise MacspecError("the JSON schema must be a JSON object")
        # Compact JSON, as OpenAI's structured outputs give: free whitespace lets a small
        # model pad forever (a schema may still ask for it with its own x-guidance).
        schema = {"x-guidance": {"whitespace_flexible": False}, **schema}
        return LLMatcher.grammar_from_json_schema(schema)


def ll_tokenizer(tokenizer: Any) -> LLTokenizer:
    """llguidance's view of a model's tokenizer (mlx-lm's TokenizerWrapper), built once per
    tokenizer: it takes a second or two on a 150k vocabulary."""
    from llguidance import LLTokenizer

    found = _tokenizers.get(tokenizer)
    if found is None:
        backend = tokenizer._tokenizer.backend_tokenizer  # the Rust tokenizer, as llguidance.hf
        eos = sorted(tokenizer.eos_token_ids)
        found = LLTokenizer(backend.to_str(), eos_token=eos[0] if len(eos) == 1 else eos)
        _tokenizers[tokenizer] = found
    return found


class Constraint:
    """One generation's matcher over a grammar: the mask of the next position, forced ids,
    and the ids the answer keeps (rolled back where guesses were rejected)."""

    def __init__(self, grammar: Grammar, tokenizer: Any):
        from llguidance import LLMatcher

        self.ends = frozenset(tokenizer.eos_token_ids)
        self.tokenizer = ll_tokenizer(tokenizer)
        try:
            self.matcher = LLMatcher(self.tokenizer, grammar.compiled())
        except (ValueError, TypeError, RuntimeError) as exc:  # llguidance's compile errors
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MacspecError(f"the {grammar.kind} cannot be used: {reason}") from None
        if self.matcher.is_error():
            reason = self.matcher.get_error().strip().splitlines()[0]
            raise MacspecError(f"the {grammar.kind} cannot be used: {reason}")

    def forced(self) -> list[int]:
        """The ids the grammar forces next (its fixed text, as the tokenizer spells it); they
        are guesses like any other, since the target may spell the same text otherwise."""
        return list(self.matcher.compute_ff_tokens())

    def admitted(self, guesses: list[int], eos_ids: frozenset[int]) -> list[int]:
        """The guesses the grammar admits from here, in order, through the first end of
        sequence (none after it can count)."""
        end = next((i + 1 for i, t in enumerate(guesses) if t in eos_ids), len(guesses))
        guesses = guesses[:end]
        return guesses[: self.matcher.validate_tokens(guesses)] if guesses else []

    def masks_along(self, guesses: list[int], width: int) -> np.ndarray:
        """(len(guesses) + 1, width) booleans: the ids the grammar admits at each position
        of a verify pass over these guesses (all of which must fit). The matcher is left
        where it was."""
        rows = []
        for i in range(len(guesses) + 1):
            rows.append(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8))
            if i < len(guesses):
                self._consume([guesses[i]])
        consumed = len([g for g in guesses if g not in self.ends])
        if consumed:
            self.matcher.rollback(consumed)
        bits = np.unpackbits(np.stack(rows), axis=1, bitorder="little").astype(bool)
        if bits.shape[1] < width:  # ids past the tokenizer's vocabulary: never admitted
            bits = np.pad(bits, ((0, 0), (0, width - bits.shape[1])))
        return bits[:, :width]

    def keep(self, ids: list[int]) -> None:
        """The answer kept these ids (each within its mask)."""
        self._consume(ids)

    def _consume(self, ids: list[int]) -> None:
        ids = [i for i in ids if i not in self.ends]  # the end: nothing left to match
        if ids and not self.matcher.consume_tokens(ids):
            raise MacspecError(
                f"the grammar refused ids it had admitted ({self.matcher.get_error()})"
            )

    @property
    def finished(self) -> bool:
        """The grammar is complete and admits nothing more but the end of sequence."""
        return self.matcher.is_stopped()
