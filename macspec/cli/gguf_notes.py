"""What loading a GGUF file did, on stderr: one line per file converted by this load (which
tensors are exact, which kept as float16)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from macspec.models.gguf.report import Conversion, watch_loads


def conversion_line(conversion: Conversion) -> str:
    """'model.gguf: 227 tensors exact (F32, Q4_K, Q5_0, Q8_0), 9 kept as float16 (Q6_K: no
    exact MLX form)'."""
    parts = []
    if conversion.exact:
        count = sum(conversion.exact.values())
        parts.append(f"{count} tensors exact ({', '.join(sorted(conversion.exact))})")
    if conversion.inexact:
        count = sum(conversion.inexact.values())
        kinds = ", ".join(sorted(conversion.inexact))
        parts.append(f"{count} kept as float16 ({kinds}: no exact MLX form)")
    return f"{conversion.file.name}: {', '.join(parts)}"


@contextmanager
def gguf_loading() -> Iterator[list[Conversion]]:
    """Around a command's model loading: the GGUF files it loaded (for --json), and once the
    load is done, a line on stderr for each file this load converted (its first load)."""
    with watch_loads() as loaded:
        yield loaded
    for conversion in loaded:
        if conversion.converted:
            print(f"macspec: {conversion_line(conversion)}", file=sys.stderr)
