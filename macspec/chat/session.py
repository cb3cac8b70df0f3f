"""A chat session: the messages, the chat template, one Engine kept across turns, the store.

Keeping one Engine is what makes a turn cheap: its target and draft caches still hold the
previous prompt and answer, and `Engine.generate` reuses their longest common prefix, so
a new turn prefills only the new tokens. When the conversation outgrows the context
window, the oldest turns are left out of the prompt (on purpose, with a notice) and stay
out, so the prompt's prefix is stable again from the next turn on.

Every user message is saved before generation starts; the answer row is written while it
streams and finished in a `finally`, so a cancel, a crash or Ctrl-C leaves it saved as far
as it got and marked incomplete. When storage fails (a locked database, a read-only file, a
full disk) nothing is lost: the messages stay in memory, a NotSaved event says why, and the
Journal saves them at the next chance (the next turn, `save_pending`, quitting).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from macspec.chat.faults import StorageError
from macspec.chat.journal import Chat, Journal, Record
from macspec.chat.pairs import ChatModels, downloaded_pairs, open_models
from macspec.chat.records import MessageRow
from macspec.chat.store import ModelInfo, Store
from macspec.engine.core.events import Done, Event, Token
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.errors import MacspecError, is_empty_prompt
from macspec.models.reasoning import ReasoningSplitter, reasoning_start
from macspec.models.templates import encode_messages
from macspec.prefix.tier import generate

__all__ = [
    "ChatModels",
    "ChatSession",
    "ContextTrimmed",
    "NotSaved",
    "SessionEvent",
    "downloaded_pairs",
    "open_models",
]

SAVE_EVERY_S = 0.5
"""How often a streaming answer is written to the store (it is always written at its end)."""


@dataclass(frozen=True)
class ContextTrimmed:
    """Older turns were left out of the prompt so the conversation fits the context window."""

    dropped_messages: int
    """Messages (from the start of the conversation) the model no longer sees."""
    prompt_tokens: int
    """Tokens of the prompt after dropping them."""
    context_length: int
    """The context window, in tokens."""

    @property
    def text(self) -> str:
        return (
            f"The conversation outgrew the {self.context_length}-token context: the oldest "
            f"{self.dropped_messages} messages are no longer sent to the model "
            f"(prompt now {self.prompt_tokens} tokens)."
        )


@dataclass(frozen=True)
class NotSaved:
    """A write to the chat database failed; what it held is kept in memory and saved later."""

    problem: str
    """The StorageError's one line: the file and what is wrong."""

    @property
    def text(self) -> str:
        return (
            f"Not saved: {self.problem}. Kept in memory and saved once storage works again "
            "(ctrl+s retries)."
        )


SessionEvent = ContextTrimmed | NotSaved | Event


@dataclass(frozen=True)
class PromptPlan:
    """What one turn will feed the engine."""

    ids: list[int]
    """The templated prompt."""
    first_message: int
    """Index in `messages` of the first message the prompt includes."""
    max_tokens: int
    """Room left for the answer (config.max_tokens, or less near the context limit)."""


class ChatSession:
    """Messages of one conversation, generated with one Engine and saved to a Store."""

    def __init__(
        self,
        engine: Engine,
        tokenizer,
        store: Store,
        conversation_id: int | None = None,
        config: GenerationConfig | None = None,
        context_length: int | None = None,
        models: ModelInfo | None = None,
        system_prompt: str | None = None,
        template_args: dict | None = None,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.store = store
        self.config = config if config is not None else GenerationConfig()
        self.context_length = context_length
        """Tokens the pair can attend to; None: no limit is enforced."""
        self.models = models if models is not None else ModelInfo()
        self.system_prompt = system_prompt
        self.template_args = dict(template_args or {})
        """Chat template arguments (--think, --chat-template-args), every turn."""
        self.journal = Journal(store, self.models)
        """The conversation's messages and which of them are stored."""
        self.first_message = 0
        """Messages before this index are no longer fed to the model (context trimming)."""
        self.last_prompt: list[int] = []
        """The ids of the latest turn's prompt (for tests and stats)."""
        self.reasoning_start: bool | None = None
        """How the latest turn's answer starts: inside a <think> block (True), outside (False);
        None for a model without think tags. The UI splits the streamed text by it too."""
        self._answer: Record | None = None
        if conversation_id is not None:
            self.resume(conversation_id)

    @property
    def conversation_id(self) -> int | None:
        """The stored conversation's id; None until its first message is saved."""
        return self.journal.current.conversation_id

    @property
    def messages(self) -> list[dict[str, str]]:
        """{'role', 'content'} of the whole conversation, oldest first (what the UI shows)."""
        return [record.message for record in self.journal.current.records]

    # -- conversations -------------------------------------------------------------------
    def new_conversation(self) -> None:
        """Start over; the next message creates a new stored conversation. Unsaved messages
        of this one are kept (and saved with the next save)."""
        self.journal.switch(Chat(None, self.models))
        self.first_message = 0

    def resume(self, conversation_id: int) -> None:
        """Load a stored conversation; the next message continues it."""
        stored = self.store.get(conversation_id)
        records = [
            Record({"role": m.role, "content": m.content}, MessageRow(m.role, m.content), m.id)
            for m in stored.messages
            if m.role != "system"
        ]
        self.journal.switch(Chat(conversation_id, stored.summary.models, records))
        self.first_message = 0

    # -- storage -------------------------------------------------------------------------
    def save_pending(self) -> StorageError | None:
        """Try again to store every message not saved yet; None when all is saved."""
        return self.journal.flush()

    @property
    def unsaved(self) -> int:
        """Messages not (fully) stored."""
        return len(self.journal.unsaved)

    @property
    def answer_saved(self) -> bool:
        """Whether the latest answer is stored as it ended."""
        return self._answer is None or self._answer.saved

    def set_engine(
        self,
        engine: Engine,
        tokenizer,
        models: ModelInfo,
        context_length: int | None = None,
    ) -> None:
        """Switch to another pair; the conversation goes on (the new caches start empty)."""
        self.engine, self.tokenizer, self.models = engine, tokenizer, models
        self.context_length = context_length
        self.first_message = 0

    # -- prompts -------------------------------------------------------------------------
    def _encode(self, messages: list[dict[str, str]]) -> list[int]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return encode_messages(self.tokenizer, system + messages, self.template_args)

    def plan(self, messages: list[dict[str, str]]) -> PromptPlan:
        """Fit `messages` (ending with the new user message) into the context window.

        Drops whole turns from the start until the prompt leaves room for an answer of
        min(max_tokens, a quarter of the context); the newest message is never dropped,
        and a message too long on its own is a MacspecError.
        """
        start = min(self.first_message, len(messages) - 1)
        limit = self.context_length
        while True:
            ids = self._encode(messages[start:])
            if limit is None:
                return PromptPlan(ids, start, self.config.max_tokens)
            room = limit - len(ids)
            wanted = min(self.config.max_tokens, max(1, limit // 4))
            if room >= wanted:
                return PromptPlan(ids, start, min(self.config.max_tokens, room))
            later = [i for i in range(start + 1, len(messages)) if messages[i]["role"] == "user"]
            if not later:
                if room >= 1:  # the newest message alone: answer in whatever room is left
                    return PromptPlan(ids, start, room)
                raise MacspecError(
                    f"the message is too long: {len(ids)} tokens with the chat template, "
                    f"and the context holds {limit}; shorten it"
                )
            start = later[0]

    # -- a turn --------------------------------------------------------------------------
    def send(
        self, text: str, cancelled: Callable[[], bool] | None = None
    ) -> Iterator[SessionEvent]:
        """Save the user's message, then return the answer's events as they stream.

        Raises at once (nothing saved, nothing changed) for an empty or too long message.
        The answer is saved while streaming, and finished whatever way the stream ends.
        """
        if is_empty_prompt(text):  # whitespace is content, as on every other path
            raise MacspecError("the message is empty")
        user = {"role": "user", "content": text}
        plan = self.plan([*self.messages, user])
        answer = {"role": "assistant", "content": ""}
        chat = self.journal.current
        if chat.conversation_id is None:  # stored with the models of its first saved turn
            chat.models = self.models
        # The answer is in the history from now on, so turns always alternate.
        chat.records += [
            Record(user, MessageRow("user", text)),
            Record(answer, MessageRow("assistant", "", complete=False, models=self.models)),
        ]
        self._answer = chat.records[-1]
        failed = self.journal.flush()  # the user's message, and anything unsaved before it
        notices: list[ContextTrimmed | NotSaved] = []
        if plan.first_message > self.first_message:
            notices.append(
                ContextTrimmed(plan.first_message, len(plan.ids), self.context_length or 0)
            )
        if failed is not None:
            notices.append(NotSaved(str(failed)))
        self.first_message = plan.first_message
        self.last_prompt = plan.ids
        self.reasoning_start = reasoning_start(self.tokenizer, plan.ids)
        # The engine stops the answer at the context window (finish reason 'context').
        config = replace(self.config, context_length=self.context_length)
        return self._stream(plan.ids, config, self._answer, cancelled, notices)

    def _stream(
        self,
        ids: list[int],
        config: GenerationConfig,
        record: Record,
        cancelled: Callable[[], bool] | None,
        notices: list[ContextTrimmed | NotSaved],
    ) -> Iterator[SessionEvent]:
        so_far = AnswerSoFar(self.reasoning_start)
        done: Done | None = None
        finish = "interrupted"  # closed early or Ctrl-C, unless we learn better
        saved_at = time.monotonic()
        # After a failed write, no more writes this turn until its end: a locked database
        # would hold each one for the busy timeout.
        writing = record.id is not None
        events = generate(self.engine, ids, config, cancelled)  # from the disk cache, too
        try:
            yield from notices
            for event in events:
                if isinstance(event, Token):
                    so_far.add(event.text, event.source.value)
                    record.message["content"] = so_far.answer
                    if writing and time.monotonic() - saved_at >= SAVE_EVERY_S:
                        _fill(record.row, so_far.row(complete=False))
                        failed = self.journal.rewrite(record)
                        saved_at = time.monotonic()
                        if failed is not None:
                            writing = False
                            yield NotSaved(str(failed))
                elif isinstance(event, Done):
                    done = event
                yield event
        except Exception:
            finish = "error"
            raise
        finally:
            events.close()  # leaves both caches holding exactly what was delivered
            if done is not None:
                so_far.finish(done.tail)
                complete = done.finish_reason != "cancelled"
                _fill(record.row, so_far.row(complete), done.finish_reason, done.stats.to_dict())
            else:
                so_far.finish("")
                _fill(record.row, so_far.row(complete=False), finish)
            record.message["content"] = so_far.answer
            # A stored answer is rewritten; one never stored is saved with its turn now.
            if record.id is not None:
                self.journal.rewrite(record)
            else:
                self.journal.flush()


def _fill(row: MessageRow, fields: dict, finish_reason: str | None = None, stats=None) -> None:
    """Set an answer's row from AnswerSoFar.row() fields, a finish reason and stats."""
    row.content, row.complete = fields["content"], fields["complete"]
    row.token_count, row.reasoning = fields["token_count"], fields["reasoning"]
    row.sources, row.finish_reason, row.stats = fields["sources"], finish_reason, stats


class AnswerSoFar:
    """A streaming answer as it is stored: the answer text, the reasoning apart (thinking
    models), and the source of each piece of answer text, as runs of [text, source]."""

    def __init__(self, reasoning_start: bool | None):
        self.splitter = ReasoningSplitter(reasoning_start) if reasoning_start is not None else None
        self.tokens = 0
        self._answer: list[str] = []
        self.sources: list[list[str]] = []

    def add(self, text: str, source: str, counts: bool = True) -> None:
        self.tokens += counts
        answer = text if self.splitter is None else self.splitter.feed(text).answer
        self._append(answer, source)

    def finish(self, tail: str) -> None:
        """The text released only at the end (held back for a stop string or a tag)."""
        self.add(tail, "target", counts=False)
        if self.splitter is not None:
            self._append(self.splitter.flush().answer, "target")

    def _append(self, text: str, source: str) -> None:
        if not text:
            return
        self._answer.append(text)
        if self.sources and self.sources[-1][1] == source:
            self.sources[-1][0] += text
        else:
            self.sources.append([text, source])

    @property
    def answer(self) -> str:
        return "".join(self._answer)

    @property
    def reasoning(self) -> str | None:
        if self.splitter is None or not self.splitter.reasoning:
            return None
        return self.splitter.reasoning.rstrip("\n")

    def row(self, complete: bool) -> dict:
        """The fields of `Store.update_answer` it decides."""
        return {
            "content": self.answer,
            "complete": complete,
            "token_count": self.tokens,
            "reasoning": self.reasoning,
            "sources": self.sources,
        }
