"""Tiny GGUFs carrying a real vocabulary (Qwen3's, Llama 3's) under a chosen
`tokenizer.ggml.pre`, and the texts whose ids tell llama.cpp's pre-tokenizer regexes apart:
shared by tests/test_gguf_pretokenizers.py and scripts/capture/llamacpp_pretokenizers.py
(which records llama.cpp's ids for them in tests/fixtures/llamacpp/pretokenizers.json)."""

from __future__ import annotations

from pathlib import Path

from ggufkit import hf_tokenizer_writer, write_gguf
from tiny import CONFIGS, arch_model
from toolkit import llama3_files, qwen3_files

FIXTURE = Path(__file__).parent / "fixtures" / "llamacpp" / "pretokenizers.json"
CASES = [("llama3", pre) for pre in ("refact", "smollm", "starcoder", "gpt-2", "llama-bpe")]
CASES += [("qwen3", pre) for pre in ("qwen2", "refact", "deepseek-coder", "deepseek-llm")]
CASES += [("qwen3", pre) for pre in ("falcon", "command-r", "tekken", "gpt-4o", "default")]
"""(vocabulary, pre name): Llama 3's merges join digits and spaces, so its ids show the splits."""
VOCABULARIES = {
    "qwen3": (qwen3_files, "qwen3", 151_936),
    "llama3": (llama3_files, "llama", 128_256),
}
TEXTS = [
    "12345 3.14159 1,000,000 2026-12-07 007",
    "don't I'LL we've SHE'D it's",
    "a  b   c\t\td\n\n\ne \r\n f       g   ",
    "東京タワー 서울 北京 Привет naïve café Ærøskøbing straße",
    "?!... --- ===>>> ((())) $$$ ^^ ~|`",
    "def f(x):\n    return x**2  # square\n\nprint(f(12))",
    "   leading and trailing   \n",
]


def vocabulary_gguf(folder: Path, vocabulary: str, pre: str) -> Path:
    """A one-layer GGUF with `vocabulary`'s published tokenizer, written as convert_hf_to_gguf.py
    writes it, but naming `pre` as its pre-tokenizer."""
    files, model_type, vocab_size = VOCABULARIES[vocabulary]
    published = files(folder / "hf")
    shape = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, head_dim=8)
    shape |= dict(num_key_value_heads=1, num_hidden_layers=1, tie_word_embeddings=True)
    model = arch_model("qwen3", seed=0, vocab=vocab_size, model_type=model_type, **shape)
    path = folder / f"{vocabulary}-{pre}.gguf"
    writer = hf_tokenizer_writer(published, vocab_size, pre)
    write_gguf(model, CONFIGS[id(model)], path, tokenizer=writer)
    return path
