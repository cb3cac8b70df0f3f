"""The stats bar: the pair, what is happening, the colour legend, live figures, a sparkline."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from tui.live import Figures, figures_line

BARS = "▁▂▃▄▅▆▇█"


class AcceptanceSparkline(Sparkline):
    """Textual's Sparkline on a fixed 0..1 scale: the share of guesses kept per cycle.

    The stock renderer scales bars to the data's own min..max, so an answer accepted at
    100% throughout would draw flat at the bottom; acceptance needs an absolute scale.
    Cycles are averaged into one bar per cell when there are more than fit.
    """

    def render(self) -> Text:
        data = list(self.data or [])
        width = max(1, self.size.width)
        if not data:
            return Text("")
        if len(data) > width:
            edges = [len(data) * i // width for i in range(width + 1)]
            data = [sum(data[a:b]) / (b - a) for a, b in zip(edges, edges[1:])]
        low = self.get_component_styles("sparkline--min-color").color
        high = self.get_component_styles("sparkline--max-color").color
        bars = Text()
        for share in data:
            share = min(1.0, max(0.0, share))
            colour = low.blend(high, share).rich_color
            bars.append(BARS[min(len(BARS) - 1, int(share * len(BARS)))], Style(color=colour))
        return bars


SPARKLINE_MIN = 8
"""Fewest cells worth drawing the sparkline in; on a narrower bar it goes before any figure."""


class StatsBar(Vertical):
    """Two lines: `pair · state · legend`, then `figures ▁▃▅ acceptance per cycle`; a third,
    acceptance by source of guesses, while guesses come from prompt lookup too.

    On a narrow terminal the sparkline goes first, then the figures that matter least; the
    legend shortens, so no line wraps."""

    COMPONENT_CLASSES = {"stats-bar--draft", "stats-bar--target", "stats-bar--state"}

    def __init__(self, pair: str, mask_timings: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pair = pair
        self.state = "ready"
        self.colours = True
        self.figures = Figures()
        self.mask_timings = mask_timings

    def compose(self):
        yield Static(id="status")
        with Horizontal(id="figures-row"):
            yield Static(id="figures")
            yield Static(" · acceptance/cycle ", id="sparkline-label")
            yield AcceptanceSparkline([], id="acceptance")
        yield Static(id="sources")

    def on_mount(self) -> None:
        self._render_status()
        self._render_figures()

    def set_pair(self, pair: str) -> None:
        self.pair = pair
        self._render_status()

    def set_state(self, state: str) -> None:
        self.state = state
        self._render_status()

    def set_colours(self, on: bool) -> None:
        self.colours = on
        self._render_status()

    def show(self, figures: Figures) -> None:
        """New live figures of the answer streaming (or of the last one)."""
        self.figures = figures
        self._render_figures()

    def reset(self) -> None:
        self.show(Figures())

    def on_resize(self) -> None:
        self._render_status()
        self._render_figures()

    @property
    def _cells(self) -> int | None:
        """Cells for text inside the padding; None before the first layout."""
        width = self.content_region.width
        return width if width > 0 else None

    def _render_status(self) -> None:
        style = self.get_component_rich_style
        line = Text.assemble(
            (self.pair, "bold"), "  ·  ", (self.state, style("stats-bar--state")), "  ·  "
        )
        cells = self._cells
        long = cells is None or cells >= len(line) + 44
        if self.colours:
            line.append_text(
                Text.assemble(
                    ("■ accepted draft guess" if long else "■ draft", style("stats-bar--draft")),
                    "  ",
                    ("■ target's own token" if long else "■ target", style("stats-bar--target")),
                )
            )
        else:
            line.append("source colours off (ctrl+t)" if long else "colours off")
        if cells is not None:
            line.truncate(cells, overflow="ellipsis")
        self.query_one("#status", Static).update(line)

    def _render_figures(self) -> None:
        figures = self.figures
        cells = self._cells
        line = figures_line(figures, self.mask_timings, cells)
        label = self.query_one("#sparkline-label", Static)
        sparkline = self.query_one("#acceptance", Sparkline)
        room = None if cells is None else cells - len(line) - len(" · acceptance/cycle ") - 1
        sparkline.display = label.display = room is None or room >= SPARKLINE_MIN
        if room is not None and sparkline.display:
            sparkline.styles.width = min(30, room)
        self.query_one("#figures", Static).update(Text(line))
        sparkline.data = list(figures.acceptance_history)
        widget = self.query_one("#sources", Static)
        widget.display = figures.sources is not None
        widget.update(Text(f"guesses kept by source: {figures.sources or ''}"))
