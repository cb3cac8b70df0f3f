"""The pre-tokenizer llama.cpp splits text with before byte-level BPE, by the file's
`tokenizer.ggml.pre`: llama.cpp's own regex lists (`llm_tokenizer_bpe` in src/llama-vocab.cpp,
each list applied in turn, matches and the text between them kept apart), for every pre name
its loader maps to a type (aliases included), as tokenizers' `Split` (Isolated) steps then
`ByteLevel` without its own regex.

Left out, so the converter's choice stands: the names whose text is not byte-encoded (gemma4,
granite-embed-multi-311m, mmbert, sarvam-moe, whitespace), those llama.cpp splits with code
rather than a regex (kimi-k2, afmoe), and superbpe (a zero-width split). A character C++ source
writes raw but that is not printable is written `\\x{...}` (Oniguruma's code point escape).
"""

from __future__ import annotations

from typing import Any

LLAMA3_SPLITS = (
    (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
JAIS2_SPLITS = (
    (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|"
        r"\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|"
        r"\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
    ),
)
DEEPSEEK_LLM_SPLITS = (
    r"[\r\n]",
    (
        r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕ"
        r"Ἐ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳ"
        r"Ꙁ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"
    ),
    r"\s?[!-/:-~！-／：-～‘-‟\x{3000}-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-\x{D7FF}]+",
    r"\p{N}+",
)
DEEPSEEK3_LLM_SPLITS = (
    r"\p{N}{1,3}",
    r"[一-龥\x{3040}-ゟ゠-ヿ]+",
    (
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"""
        r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
SPARK2_5_SPLITS = (
    r"\p{N}{1,3}",
    r"[一-龥\x{3040}-ゟ゠-ヿ]+",
    (
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"""
        r" ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"
    ),
    r"\p{N}",
)
YOUTU_SPLITS = (
    r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\x{3040}-ゟ゠-ヿ]+",
    (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|"
        r"'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}"
        r"\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|"
        r"'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
DEEPSEEK_CODER_SPLITS = (
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[一-龥ࠀ-一가-\x{D7FF}]+",
    r"\p{N}",
)
FALCON_SPLITS = (
    r"[\p{P}\$\+<=>\^~\|`]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"[0-9][0-9][0-9]",
)
STARCODER_SPLITS = (
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
)
GPT2_SPLITS = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",)
QWEN2_SPLITS = (
    (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
QWEN35_SPLITS = (
    (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}"
        r"]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|"
        r"\s+"
    ),
)
PORO_SPLITS = (r" ?[^(\s|.,!?…。，、।۔،)]+",)
VIKING_SPLITS = (
    r" ?[^(\s|.,!?…。，、।۔،)]+",
    r"\p{N}",
)
TEKKEN_SPLITS = (
    (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|"
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|"
        r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
CHAMELEON_SPLITS = (
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
)
GPT4O_SPLITS = (
    (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|"
        r"'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-"
        r"z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|"
        r"'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
GRANITE_EMB_MULTI_SPLITS = (
    (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|"
        r"'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])"
        r"([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|"
        r"'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
TINY_AYA_SPLITS = (
    r"\d{1,3}(?=(?:\d{3})*\b)",
    (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|"
        r"'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}"
        r"\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|"
        r"'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
BAILINGMOE_SPLITS = (
    (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
    ),
)
SEED_CODER_SPLITS = (
    (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
UFAKZEKA_SPLITS = (
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
LAGUNA_SPLITS = (
    r"[^\n]+|[\n]+",
    (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
EXAONE_MOE_SPLITS = (
    (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}"
        r"*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|"
        r"\s+(?!\S)|\s+"
    ),
)
MINICPM5_SPLITS = (
    r"\p{N}{1,3}",
    (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
        r"\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
)
DEFAULT_SPLITS = (
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
)
SPLITS_BY_PRE: dict[str, tuple[str, ...]] = {
    "chatglm-bpe": LLAMA3_SPLITS,
    "dbrx": LLAMA3_SPLITS,
    "falcon-h1": LLAMA3_SPLITS,
    "falcon3": LLAMA3_SPLITS,
    "glm4": LLAMA3_SPLITS,
    "glm5": LLAMA3_SPLITS,
    "jina-v5-nano": LLAMA3_SPLITS,
    "lfm2": LLAMA3_SPLITS,
    "llama-bpe": LLAMA3_SPLITS,
    "llama-v3": LLAMA3_SPLITS,
    "llama3": LLAMA3_SPLITS,
    "midm-2.0": LLAMA3_SPLITS,
    "pixtral": LLAMA3_SPLITS,
    "smaug-bpe": LLAMA3_SPLITS,
    "jais-2": JAIS2_SPLITS,
    "deepseek-llm": DEEPSEEK_LLM_SPLITS,
    "deepseek-v3": DEEPSEEK3_LLM_SPLITS,
    "hunyuan-dense": DEEPSEEK3_LLM_SPLITS,
    "hy_v4": DEEPSEEK3_LLM_SPLITS,
    "joyai-llm": DEEPSEEK3_LLM_SPLITS,
    "spark2_5": SPARK2_5_SPLITS,
    "youtu": YOUTU_SPLITS,
    "deepseek-coder": DEEPSEEK_CODER_SPLITS,
    "falcon": FALCON_SPLITS,
    "codeshell": STARCODER_SPLITS,
    "command-r": STARCODER_SPLITS,
    "exaone": STARCODER_SPLITS,
    "mellum2": STARCODER_SPLITS,
    "minerva-7b": STARCODER_SPLITS,
    "refact": STARCODER_SPLITS,
    "smollm": STARCODER_SPLITS,
    "starcoder": STARCODER_SPLITS,
    "a.x-4.0": GPT2_SPLITS,
    "exaone4": GPT2_SPLITS,
    "gigachat": GPT2_SPLITS,
    "gpt-2": GPT2_SPLITS,
    "granite-docling": GPT2_SPLITS,
    "jais": GPT2_SPLITS,
    "jina-de": GPT2_SPLITS,
    "jina-es": GPT2_SPLITS,
    "jina-v1-en": GPT2_SPLITS,
    "jina-v2-code": GPT2_SPLITS,
    "jina-v2-de": GPT2_SPLITS,
    "jina-v2-es": GPT2_SPLITS,
    "mellum": GPT2_SPLITS,
    "modern-bert": GPT2_SPLITS,
    "mpt": GPT2_SPLITS,
    "olmo": GPT2_SPLITS,
    "phi-2": GPT2_SPLITS,
    "roberta-bpe": GPT2_SPLITS,
    "trillion": GPT2_SPLITS,
    "deepseek-r1-qwen": QWEN2_SPLITS,
    "f2llmv2": QWEN2_SPLITS,
    "grok-2": QWEN2_SPLITS,
    "hunyuan": QWEN2_SPLITS,
    "kormo": QWEN2_SPLITS,
    "megrez": QWEN2_SPLITS,
    "qwen2": QWEN2_SPLITS,
    "solar-open": QWEN2_SPLITS,
    "stablelm2": QWEN2_SPLITS,
    "qwen35": QWEN35_SPLITS,
    "bloom": PORO_SPLITS,
    "gpt3-finnish": PORO_SPLITS,
    "poro-chat": PORO_SPLITS,
    "viking": VIKING_SPLITS,
    "tekken": TEKKEN_SPLITS,
    "chameleon": CHAMELEON_SPLITS,
    "gpt-4o": GPT4O_SPLITS,
    "kanana2": GPT4O_SPLITS,
    "llama4": GPT4O_SPLITS,
    "minimax-m2": GPT4O_SPLITS,
    "talkie": GPT4O_SPLITS,
    "granite-embed-multi-97m": GRANITE_EMB_MULTI_SPLITS,
    "cohere2moe": TINY_AYA_SPLITS,
    "tiny_aya": TINY_AYA_SPLITS,
    "bailingmoe": BAILINGMOE_SPLITS,
    "bailingmoe2": BAILINGMOE_SPLITS,
    "llada-moe": BAILINGMOE_SPLITS,
    "seed-coder": SEED_CODER_SPLITS,
    "ufakzeka": UFAKZEKA_SPLITS,
    "laguna": LAGUNA_SPLITS,
    "exaone-moe": EXAONE_MOE_SPLITS,
    "minicpm5": MINICPM5_SPLITS,
    "default": DEFAULT_SPLITS,
}


def llamacpp_pre_tokenizer(pre: str | None) -> Any | None:
    """tokenizers' pre-tokenizer that splits as llama.cpp does for `pre`, or None where the
    table has no entry for it."""
    from tokenizers import Regex, pre_tokenizers

    splits = SPLITS_BY_PRE.get(pre or "")
    if splits is None:
        return None
    steps = [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return pre_tokenizers.Sequence([*steps, byte_level])
