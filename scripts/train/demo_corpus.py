"""The demo pair's data: instruction pairs from the standard library, a BPE tokenizer, batches.

Dev-only, imported by scripts/train/train_demo_pair.py (and the demo's MTP head training).
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from pathlib import Path

import numpy as np

BOS, EOS, PAD = "<|begin|>", "<|end|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, "<|system|>", "<|user|>", "<|assistant|>"]
# Every turn is "<|role|>\n{content}<|end|>"; <|end|> is also the EOS that stops generation.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant') }}{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
SKIP_DIRS = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "turtledemo",
    "ensurepip",
    "pydoc_data",
    "__pycache__",
    "venv",
}


# ---------------------------------------------------------------- 1. corpus


def stdlib_files(root: Path) -> list[Path]:
    """The stdlib .py files worth learning from, sorted for determinism."""
    files = []
    for path in root.rglob("*.py"):
        parts = set(path.relative_to(root).parts[:-1])
        if parts & SKIP_DIRS or path.name.startswith("test_") or "config-" in str(path):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def function_pairs(path: Path, root: Path, max_chars: int) -> list[dict]:
    """(prompt, source) pairs for every documented function or method of one file."""
    try:
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = src.splitlines()
    module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
    pairs = []

    def visit(node, owner: str | None):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                pair = make_pair(child, owner)
                if pair:
                    pairs.append(pair)

    def make_pair(fn, owner):
        doc = ast.get_docstring(fn)
        if not doc:
            return None
        code = textwrap.dedent("\n".join(lines[fn.lineno - 1 : fn.end_lineno])).strip("\n")
        if len(code) > max_chars or not code.startswith(("def ", "async def ")):
            return None
        summary = " ".join(doc.strip().split("\n\n")[0].split())
        name = f"{fn.name}({ast.unparse(fn.args)})"
        kind = f"method `{owner}.{name}`" if owner else f"function `{name}`"
        prompt = f"Write a Python {kind}: {summary}"
        where = ".".join(x for x in (module, owner, fn.name) if x)
        return {"prompt": prompt, "code": code, "where": where}

    visit(tree, None)
    return pairs


def render(tokenizer_config: dict, prompt: str, answer: str | None = None) -> str:
    """The chat template applied with jinja2, exactly as transformers would."""
    import jinja2

    def raise_exception(message):
        raise ValueError(message)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    messages = [{"role": "user", "content": prompt}]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return env.from_string(tokenizer_config["chat_template"]).render(
        messages=messages, add_generation_prompt=answer is None, bos_token=BOS, eos_token=EOS
    )


def build_corpus(seed: int, max_chars: int, holdout: float) -> tuple[list[dict], list[dict]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    pairs, seen = [], set()
    for path in stdlib_files(root):
        for pair in function_pairs(path, root, max_chars):
            if pair["code"] not in seen:  # the stdlib repeats a few functions verbatim
                seen.add(pair["code"])
                pairs.append(pair)
    random.Random(seed).shuffle(pairs)
    n_eval = max(20, round(holdout * len(pairs)))
    return pairs[n_eval:], pairs[:n_eval]


# ---------------------------------------------------------------- 2. tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_files(tok) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json for a transformers fast tokenizer."""
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 512,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    return {"tokenizer_config.json": config, "special_tokens_map.json": special}


def pack(seqs: list[list[int]], seq_len: int, rng: np.random.Generator):
    """Shuffle whole conversations into rows of seq_len + 1 tokens; segment ids mask across them."""
    order = rng.permutation(len(seqs))
    rows, segs, row, seg, n = [], [], [], [], 0
    for i in order:
        s = seqs[i]
        if len(row) + len(s) > seq_len + 1:
            rows.append(row + [0] * (seq_len + 1 - len(row)))
            segs.append(seg + [0] * (seq_len + 1 - len(seg)))
            row, seg = [], []
        n += 1
        row, seg = row + s, seg + [n] * len(s)
    if row:
        rows.append(row + [0] * (seq_len + 1 - len(row)))
        segs.append(seg + [0] * (seq_len + 1 - len(seg)))
    return np.array(rows, np.int32), np.array(segs, np.int32)


def batches(seqs, seq_len: int, batch_size: int, seed: int):
    """Endless (tokens, segments) batches, one fresh packing per epoch."""
    rng = np.random.default_rng(seed)
    while True:
        rows, segs = pack(seqs, seq_len, rng)
        for i in range(0, len(rows) - batch_size + 1, batch_size):
            yield rows[i : i + batch_size], segs[i : i + batch_size]
