"""`macspec serve` with a thinking model: the reasoning in `reasoning_content`, the answer in
`content`, streamed or not (a scripted model that thinks on cue, Qwen3's own chat template)."""

from __future__ import annotations

import openai
from mlx_lm.tokenizer_utils import load as load_tokenizer
from test_thinking import ANSWER, thinking_engine, write_qwen3_tokenizer

from macspec.models.templates import encode_prompt
from macspec.serve.backend import Backend
from macspec.serve.server import ServerThread


def test_a_thinking_model_puts_its_reasoning_in_reasoning_content(tmp_path):
    write_qwen3_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path, eos_token_ids=[258])
    messages = [{"role": "user", "content": "2+2?"}]
    engine = thinking_engine(tok, encode_prompt(tok, "2+2?"), ANSWER, draft=True)
    with ServerThread(Backend(engine, tok, "thinker", k=3)) as running:
        api = openai.OpenAI(base_url=running.base_url, api_key="x", max_retries=0)
        whole = api.chat.completions.create(model="thinker", messages=messages, max_tokens=200)
        message = whole.choices[0].message
        assert message.content == "It is **4**."
        assert message.model_extra["reasoning_content"] == "The user asks 2+2. That is 4."
        parts = api.chat.completions.create(
            model="thinker", messages=messages, max_tokens=200, stream=True
        )
        deltas = [c.choices[0].delta for c in parts]
        reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
        assert reasoning.strip() == "The user asks 2+2. That is 4."
        assert "".join(d.content or "" for d in deltas) == "It is **4**."
