"""`macspec chat`: the Textual app (`make_app` in tui/factory.py builds it for the CLI and
the tests).

Generation runs in a thread worker (tui/turn.py) that iterates the session's events and
posts Messages (thread-safe) to the app; the UI thread only renders them, so it never blocks
while tokens stream. Token pieces are batched (at most 15 posts a second), and the figures
sent along are cumulative counts, so batching changes nothing that is shown. Loading another
pair runs in a thread worker too.

Whatever happens in the worker, it ends the turn (Finished or Rejected), so the chat never
stays "answering". A storage failure is one line in the transcript; the messages are kept
in memory and saved on the next turn or ctrl+s. SIGTERM, SIGHUP and SIGINT (with
`exit_on_signals`) end a running answer, saved as 'interrupted', then exit with 128 + the
signal's number. (In the app's raw terminal ctrl+c is a key, so a SIGINT comes from `kill`.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from textual import on, work
from textual.binding import Binding
from textual.widgets import Footer
from textual.worker import Worker, get_current_worker

from macspec.chat.session import ChatModels, ChatSession
from macspec.errors import MacspecError
from macspec.models.catalog import Pair
from tui.messages import (
    Chunk,
    Finished,
    Noticed,
    PairFailed,
    PairLoaded,
    Rejected,
    Saved,
    Started,
)
from tui.quitting import Quitting
from tui.terminal import hangup_safe
from tui.turn import answer_summary, in_memory, run_turn
from tui.widgets.pickers import HistoryPicker, PairPicker
from tui.widgets.prompt import PromptInput
from tui.widgets.stats_bar import StatsBar
from tui.widgets.transcript import AnswerMessage, Transcript
from tui.wording import welcome

STATS_EVERY_S = 1 / 4
"""Most often the stats bar redraws while an answer streams (its figures change slowly; the
text itself shows as it comes). The final figures always show."""


class ChatApp(Quitting, inherit_bindings=False):
    """Chat with a target/draft pair; accepted draft guesses are shown in their own colour."""

    CSS_PATH = "app.tcss"
    TITLE = "macspec chat"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit"),  # first, so a narrow footer still shows it
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+p", "pick_pair", "Pairs"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+r", "history", "History"),
        Binding("ctrl+t", "toggle_colours", "Colours"),
        Binding("ctrl+o", "toggle_reasoning", "Reasoning", show=False),
        Binding("ctrl+s", "retry_save", "Save again", show=False),
        Binding("ctrl+c", "help_quit", show=False, system=True),
    ]

    def __init__(
        self,
        session: ChatSession,
        list_pairs: Callable[[], Sequence[Pair]],
        load_pair: Callable[[Pair], ChatModels],
        warnings: Sequence[str] = (),
        mask_timings: bool = False,
        exit_on_signals: bool = False,
    ) -> None:
        super().__init__()
        if exit_on_signals:  # a closed terminal window ends the chat as SIGHUP does
            self.driver_class = hangup_safe(self.driver_class)
        self.exit_on_signals = exit_on_signals
        """Handle SIGTERM/SIGHUP/SIGINT (the CLI; tests run the app inside pytest's own loop)."""
        self.session = session
        self.list_pairs = list_pairs
        self.load_pair = load_pair
        self.startup_warnings = list(warnings)
        self.mask_timings = mask_timings
        """Show no clock readings (snapshot tests): everything else is deterministic."""
        self.colours = True
        self.generating = False
        self.loading: str | None = None
        self.saving = False
        """A retry (ctrl+s) is saving what storage refused."""
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
        yield Footer(compact=True)

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
        if self.exit_on_signals:
            self.listen_for_exit_signals()
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
            await transcript.add_notice(welcome(session.models.label, session.models.pair))
            return
        await transcript.add_notice(f"Conversation #{session.conversation_id}, resumed.")
        try:
            stored = self.session.store.get(session.conversation_id).messages
        except MacspecError as exc:  # the database failed since: show what is in memory
            await transcript.add_notice(f"Cannot read it back: {exc}", "error")
            stored = [in_memory(m) for m in session.messages]
        await transcript.add_stored(stored)

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
        if self.saving:
            self.notify("Saving what storage refused… a moment.", severity="warning")
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
        run_turn(
            self.session,
            text,
            lambda: cancel.is_set() or worker.is_cancelled,
            self._interrupt.is_set,
            self.post_message,
        )

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
        answer = self._answer
        summary, tail = answer_summary(message, self.mask_timings)
        if message.done is None and message.error is not None:
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

    def action_retry_save(self) -> None:
        """ctrl+s: try again to save what storage refused (off the UI thread: a locked
        database can hold a write for the busy timeout)."""
        if self._busy("saving again"):
            return
        if not self.session.unsaved:
            self.notify("Everything is saved.")
            return
        self.saving = True
        self.stats_bar.set_state("saving…")
        self._save_again()

    @work(thread=True, exclusive=True, group="save", exit_on_error=False)
    def _save_again(self) -> None:
        count = self.session.unsaved
        try:
            problem = self.session.save_pending()
        except Exception as exc:  # noqa: BLE001 - said, never fatal
            problem = exc
        self.post_message(Saved(count, None if problem is None else str(problem)))

    @on(Saved)
    async def _saved(self, message: Saved) -> None:
        self.saving = False
        self.stats_bar.set_state("ready")
        if message.problem is None:
            await self.transcript.add_notice(f"Saved {message.count} messages kept in memory.")
        else:
            await self.transcript.add_notice(f"Still not saved: {message.problem}", "error")

    def on_unmount(self) -> None:
        self._cancel.set()  # however the app ends, a running answer stops (and is saved)

    # -- pairs, chats, colours -------------------------------------------------------------
    def _busy(self, doing: str) -> bool:
        if self.generating or self.loading or self.saving:
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
            if name is not None and name == self.session.models.pair:
                self.call_later(self.transcript.add_notice, f"Already using {name}.")
            elif name is not None:
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
        try:
            conversations = self.session.store.list_conversations()
        except MacspecError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return

        async def chosen(conversation_id: str | None) -> None:
            if conversation_id is not None:
                try:
                    self.session.resume(int(conversation_id))
                except MacspecError as exc:
                    self.notify(str(exc), severity="error", timeout=8)
                    return
                await self._show_conversation()

        self.push_screen(HistoryPicker(conversations, self.session.conversation_id), chosen)

    def action_toggle_reasoning(self) -> None:
        self.transcript.toggle_reasoning()

    async def action_toggle_colours(self) -> None:
        self.colours = not self.colours
        self.set_class(self.colours, "-sources")
        self.stats_bar.set_colours(self.colours)
        if self._answer is not None:  # the answer streaming: its Markdown view catches up
            await self._answer.catch_up()
