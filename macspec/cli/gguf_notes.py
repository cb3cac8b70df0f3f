"""What loading a GGUF file did, on stderr: a progress bar while a file is converted (a
terminal only), then one line per file converted by this load (its layout, which tensors are
exact, which not, and its bytes in memory against the file's)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from macspec.models.gguf.report import Conversion, watch_loads
from macspec.text import byte_size


def conversion_line(conversion: Conversion) -> str:
    """'model.gguf (compact: 0.27 GB in memory, the file 0.25 GB): 119 tensors exact (F32,
    Q5_0, Q8_0), 36 not (Q4_K: float16 scales; Q6_K: requantized)'."""
    parts = []
    if conversion.exact:
        count = sum(conversion.exact.values())
        parts.append(f"{count} tensors exact ({', '.join(sorted(conversion.exact))})")
    if conversion.inexact:
        count = sum(conversion.inexact.values())
        why = inexact_reasons(conversion.inexact, conversion.layout)
        parts.append(f"{count} not ({why})")
    sizes = (
        f"{conversion.layout}: {byte_size(conversion.resident_bytes)} in memory, "
        f"the file {byte_size(conversion.file_bytes)}"
    )
    return f"{conversion.file.name} ({sizes}): {', '.join(parts)}"


def inexact_reasons(inexact: dict[str, int], layout: str) -> str:
    """Why each type is not bit for bit: float16 scales, requantized, or kept as float16."""
    from macspec.models.gguf import kquants

    def reason(kind: str) -> str:
        if layout == "compact":
            qtype = kquants.Q[kind]
            mapped = kquants.affine_bits(qtype) or qtype in kquants.CODEBOOK_AFFINE
            return "float16 scales" if mapped else "requantized"
        return "kept as float16: no exact MLX form"

    return "; ".join(f"{kind}: {reason(kind)}" for kind in sorted(inexact))


@contextmanager
def gguf_loading() -> Iterator[list[Conversion]]:
    """Around a command's model loading: the GGUF files it loaded (for --json), and once the
    load is done, a line on stderr for each file this load converted (its first load)."""
    bar = ConversionBar() if sys.stderr.isatty() else None
    try:
        with watch_loads(bar.update if bar is not None else None) as loaded:
            yield loaded
    finally:
        if bar is not None:
            bar.stop()
    for conversion in loaded:
        if conversion.converted:
            print(f"macspec: {conversion_line(conversion)}", file=sys.stderr)


class ConversionBar:
    """rich's bar on stderr, started by the first conversion's first tensor: a cached or native
    file, which reports no progress, draws nothing. Gone once the load ends."""

    def __init__(self) -> None:
        self.progress = None
        self.task = None

    def update(self, name: str, done: int, total: int) -> None:
        if self.progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task(f"converting {name}", total=total)
        # Read and converted: what is left (seconds for a big file) is writing the cache.
        what = f"converting {name}" if done < total else f"{name}: writing the converted cache"
        self.progress.update(self.task, completed=done, total=total, description=what)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
