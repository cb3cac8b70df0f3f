"""`macspec chat`: the Textual app, and `make_app`, the one factory the CLI and the tests use.

Generation runs in a thread worker that iterates the session's events and posts Messages
(thread-safe) to the app; the UI thread only renders them, so it never blocks while tokens
stream. Token pieces are batched (at most ~30 posts a second), and the figures sent along are
cumulative counts, so batching changes nothing that is shown. Loading another pair runs in
a thread worker too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence

from textual import on, work
from textual.app import App
from textual.binding import Binding
from textual.widgets import Footer
from textual.worker import Worker, get_current_worker

from macspec.chat.session import (
    ChatModels,
    ChatSession,
    ContextTrimmed,
    downloaded_pairs,
    open_models,
)
from macspec.chat.store import ModelInfo, Store, StoredMessage
from macspec.engine.events import Done, Token
from macspec.engine.loop import Engine, GenerationConfig
from macspec.engine.stats import summary_line
from macspec.errors import MacspecError
from macspec.models.build import needs_draft_model
from macspec.models.catalog import Pair, resolve_models
from tui.live import LiveFigures, without_timings
from tui.messages import Chunk, Finished, Noticed, PairFailed, PairLoaded, Rejected, Started
from tui.widgets.pickers import HistoryPicker, PairPicker
from tui.widgets.prompt import PromptInput
from tui.widgets.stats_bar import StatsBar
from tui.widgets.transcript import AnswerMessage, Transcript

POST_EVERY_S = 1 / 30
"""Most often the worker posts token pieces to the UI (more would only queue up)."""
STATS_EVERY_S = 1 / 4
"""Most often the stats bar redraws while an answer streams (its figures change slowly; the
text itself shows as it comes). The final figures always show."""


def stored_summary(message: StoredMessage) -> str:
    """The summary line of an answer loaded from the store (no timings: it is history)."""
    stats = message.stats or {}
    parts = [f"{message.token_count or 0} tokens"]
    if stats.get("acceptance_rate") is not None:
        parts.append(f"acceptance {stats['acceptance_rate']:.0%}")
    if stats.get("tokens_per_pass") is not None:
        parts.append(f"{stats['tokens_per_pass']:.2f} tokens/pass")
    parts.append(message.finish_reason or "?")
    if not message.complete:
        parts.append("incomplete")
    return " · ".join(parts)


class ChatApp(App, inherit_bindings=False):
    """Chat with a target/draft pair; accepted draft guesses are shown in their own colour."""

    CSS_PATH = "app.tcss"
    TITLE = "macspec chat"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+p", "pick_pair", "Pairs"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+r", "history", "History"),
        Binding("ctrl+t", "toggle_colours", "Colours"),
        Binding("ctrl+o", "toggle_reasoning", "Reasoning", show=False),
        Binding("ctrl+q", "quit", "Quit"),  # not inherited, so it comes last in the footer
        Binding("ctrl+c", "help_quit", show=False, system=True),
    ]

    def __init__(
        self,
        session: ChatSession,
        list_pairs: Callable[[], Sequence[Pair]],
        load_pair: Callable[[Pair], ChatModels],
        warnings: Sequence[str] = (),
        mask_timings: bool = False,
    ) -> None:
        super().__init__()
        self.session = session
        self.list_pairs = list_pairs
        self.load_pair = load_pair
        self.startup_warnings = list(warnings)
        self.mask_timings = mask_timings
        """Show no clock readings (snapshot tests): everything else is deterministic."""
        self.colours = True
        self.generating = False
        self.loading: str | None = None
        self.turns_ended = 0
        """Turns that ended (answered, stopped, failed or refused): tests wait on it."""
        self._answer: AnswerMessage | None = None
        self._stats_shown = 0.0
        self._cancel = threading.Event()
        self._worker: Worker | None = None

    # -- layout ----------------------------------------------------------------------------
    def compose(self):
        yield Transcript(id="transcript")
        yield StatsBar(self.session.models.label, mask_timings=self.mask_timings, id="stats")
        yield PromptInput(id="prompt")
        yield Footer()

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def stats_bar(self) -> StatsBar:
        return self.query_one(StatsBar)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    async def on_mount(self) -> None:
        self.add_class("-sources")
        await self._show_conversation()
        for warning in self.startup_warnings:
            await self.transcript.add_notice(f"warning: {warning}", "warning")
        self.prompt.focus()

    async def _show_conversation(self) -> None:
        transcript = self.transcript
        await transcript.clear()
        self.stats_bar.reset()
        session = self.session
        if not session.messages:
            await transcript.add_notice(
                f"Chatting with {session.models.label}. Enter sends, ctrl+j adds a line, "
                "esc stops an answer."
            )
            return
        await transcript.add_notice(f"Conversation #{session.conversation_id}, resumed.")
        stored = self.session.store.get(session.conversation_id).messages
        for message in stored:
            if message.role == "user":
                await transcript.add_user(message.content)
            elif message.role == "assistant":
                await transcript.add_answer(
                    message.content,
                    stored_summary(message),
                    live=False,
                    reasoning=message.reasoning,
                    sources=message.sources,
                )

    # -- a turn ----------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def _submit(self, event: PromptInput.Submitted) -> None:
        text = event.text
        if not text.strip():
            return
        if self.generating:
            self.notify("Still answering: esc stops it.", severity="warning")
            return
        if self.loading:
            self.notify(f"Loading {self.loading}…", severity="warning")
            return
        self.prompt.clear()
        await self.transcript.add_user(text)
        self._answer = await self.transcript.add_answer()
        self._cancel = threading.Event()
        self.generating = True
        self.stats_bar.reset()
        self.stats_bar.set_state("answering (esc stops)")
        self._worker = self._generate(text, self._cancel)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, text: str, cancel: threading.Event) -> None:
        worker = get_current_worker()
        try:
            events = self.session.send(text, lambda: cancel.is_set() or worker.is_cancelled)
        except MacspecError as exc:
            self.post_message(Rejected(text, str(exc)))
            return
        self.post_message(Started(self.session.reasoning_start))
        live, pieces, posted = LiveFigures(), [], time.monotonic()
        done, error = None, None
        try:
            for event in events:  # to the end: the session saves the answer as it finishes
                live.add(event)
                if isinstance(event, ContextTrimmed):
                    self.post_message(Noticed(event.text, "warning"))
                elif isinstance(event, Token):
                    pieces.append((event.text, event.source))
                elif isinstance(event, Done):
                    done = event
                if pieces and time.monotonic() - posted >= POST_EVERY_S:
                    self.post_message(Chunk(pieces, live.figures()))
                    pieces, posted = [], time.monotonic()
        except Exception as exc:  # a crash mid-answer: saved as far as it got, shown, not fatal
            error = f"{type(exc).__name__}: {exc}"
        finally:
            events.close()
        self.post_message(Chunk(pieces, live.figures()))
        self.post_message(Finished(done, live.figures(), error))

    @on(Started)
    def _started(self, message: Started) -> None:
        if self._answer is not None:
            self._answer.split_reasoning(message.reasoning_start)

    @on(Chunk)
    async def _chunk(self, message: Chunk) -> None:
        if self._answer is not None and message.pieces:
            await self._answer.add_tokens(message.pieces)
        now = time.monotonic()
        if now - self._stats_shown >= STATS_EVERY_S:
            self.stats_bar.show(message.figures)
            self._stats_shown = now

    @on(Finished)
    async def _finished(self, message: Finished) -> None:
        answer, done = self._answer, message.done
        if done is not None:
            stats = without_timings(done.stats) if self.mask_timings else done.stats
            summary = summary_line(stats, done.finish_reason)
            if self.mask_timings:
                summary = summary.replace("ttft 0.00s", "ttft ··")
            if done.finish_reason == "cancelled":
                summary += " · stopped, saved as incomplete"
            tail = done.tail
        else:
            summary, tail = f"error: {message.error} · saved as incomplete", ""
            self.notify(f"The answer failed: {message.error}", severity="error", timeout=8)
        if answer is not None:
            await answer.finish(tail, summary)
        self.stats_bar.show(message.figures)
        self._end_turn()

    @on(Rejected)
    async def _rejected(self, message: Rejected) -> None:
        # Nothing was saved: take the bubbles back and give the text back to the prompt.
        for widget in list(self.transcript.children)[-2:]:
            await widget.remove()
        self.prompt.text = message.text
        self.notify(message.reason, severity="error", timeout=8)
        self._end_turn()

    @on(Noticed)
    async def _noticed(self, message: Noticed) -> None:
        await self.transcript.add_notice(message.text, message.kind, before=self._answer)

    def _end_turn(self) -> None:
        self._answer = None
        self.generating = False
        self.turns_ended += 1
        self.stats_bar.set_state("ready")

    def action_stop(self) -> None:
        if self.generating and not self._cancel.is_set():
            self._cancel.set()  # the engine polls it after every token
            self.stats_bar.set_state("stopping")

    async def action_quit(self) -> None:
        # Let the answer stop and be saved before the process goes.
        if self.generating and self._worker is not None:
            self._cancel.set()
            try:
                await asyncio.wait_for(self._worker.wait(), timeout=10)
            except (asyncio.TimeoutError, Exception):
                pass
        self.exit()

    def on_unmount(self) -> None:
        self._cancel.set()  # however the app ends, a running answer stops (and is saved)

    # -- pairs, chats, colours -------------------------------------------------------------
    def _busy(self, doing: str) -> bool:
        if self.generating or self.loading:
            self.notify(f"Wait for the answer (esc stops it) before {doing}.", severity="warning")
            return True
        return False

    def action_pick_pair(self) -> None:
        if self._busy("switching pairs"):
            return
        try:
            pairs = list(self.list_pairs())
        except MacspecError as exc:
            self.notify(str(exc), severity="error")
            return
        by_name = {pair.name: pair for pair in pairs}

        def chosen(name: str | None) -> None:
            if name is not None:
                self.loading = name
                self.stats_bar.set_state(f"loading {name}…")
                self._load(by_name[name])

        self.push_screen(PairPicker(pairs, self.session.models.pair), chosen)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self, pair: Pair) -> None:
        try:
            self.post_message(PairLoaded(self.load_pair(pair)))
        except Exception as exc:  # a bad folder or a failed load must not take the chat down
            self.post_message(PairFailed(pair.name, str(exc) or type(exc).__name__))

    @on(PairLoaded)
    async def _pair_loaded(self, message: PairLoaded) -> None:
        models = message.models
        self.session.set_engine(
            models.engine, models.tokenizer, models.models, models.context_length
        )
        self.loading = None
        self.stats_bar.set_pair(models.models.label)
        self.stats_bar.set_state("ready")
        await self.transcript.add_notice(f"Switched to {models.models.label}.")
        for warning in models.warnings:
            await self.transcript.add_notice(f"warning: {warning}", "warning")

    @on(PairFailed)
    def _pair_failed(self, message: PairFailed) -> None:
        self.loading = None
        self.stats_bar.set_state("ready")
        self.notify(f"Could not load {message.name}: {message.reason}", severity="error")

    async def action_new_chat(self) -> None:
        if self._busy("starting a new chat"):
            return
        self.session.new_conversation()
        await self._show_conversation()

    def action_history(self) -> None:
        if self._busy("opening another chat"):
            return
        conversations = self.session.store.list_conversations()

        async def chosen(conversation_id: str | None) -> None:
            if conversation_id is not None:
                self.session.resume(int(conversation_id))
                await self._show_conversation()

        self.push_screen(HistoryPicker(conversations, self.session.conversation_id), chosen)

    def action_toggle_reasoning(self) -> None:
        self.transcript.toggle_reasoning()

    def action_toggle_colours(self) -> None:
        self.colours = not self.colours
        self.set_class(self.colours, "-sources")
        self.stats_bar.set_colours(self.colours)


def default_pair_loader(
    num_draft_tokens: str | None = None,
    no_draft: bool = False,
    draft: str | None = None,
    cache_options=None,
) -> Callable[[Pair], ChatModels]:
    """Loads a catalog pair from disk with the command line's draft settings."""

    def load(pair: Pair) -> ChatModels:
        resolved = resolve_models(
            pair.name, None, None, need_draft=needs_draft_model(draft, no_draft)
        )
        return open_models(resolved, num_draft_tokens, no_draft, draft, cache_options)

    return load


def make_app(
    engine: Engine,
    tokenizer,
    *,
    store: Store | None = None,
    models: ModelInfo | None = None,
    config: GenerationConfig | None = None,
    context_length: int | None = None,
    conversation_id: int | None = None,
    list_pairs: Callable[[], Sequence[Pair]] | None = None,
    load_pair: Callable[[Pair], ChatModels] | None = None,
    warnings: Sequence[str] = (),
    mask_timings: bool = False,
    system_prompt: str | None = None,
    template_args: dict | None = None,
) -> ChatApp:
    """The chat app around a ready engine; tests inject tiny models, a fake catalog and loader.

    An unknown `conversation_id` is a MacspecError here, before the app starts.
    """
    session = ChatSession(
        engine,
        tokenizer,
        store if store is not None else Store(),
        conversation_id=conversation_id,
        config=config,
        context_length=context_length,
        models=models,
        system_prompt=system_prompt,
        template_args=template_args,
    )
    return ChatApp(
        session,
        list_pairs=list_pairs if list_pairs is not None else downloaded_pairs,
        load_pair=load_pair if load_pair is not None else default_pair_loader(),
        warnings=warnings,
        mask_timings=mask_timings,
    )
