"""The chat session: cache reuse across turns, context trimming, and nothing lost on a crash."""

from __future__ import annotations

import pytest
from chatkit import tiny_engine, tiny_pair

from macspec.chat import session as session_module
from macspec.chat.session import ChatSession, ContextTrimmed
from macspec.chat.store import ModelInfo
from macspec.engine.core.events import Cycle, Done, Token
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.errors import MacspecError

MODELS = ModelInfo(target="tiny/target", draft="tiny/draft", pair="tiny")


def answer(events) -> Done:
    done = [e for e in events if isinstance(e, Done)]
    assert len(done) == 1
    return done[0]


def session_for(tok, store, max_tokens=24, context_length=None, eos_bias=-1.0, **pair_kw):
    target, draft = tiny_pair(tok, eos_bias=eos_bias, **pair_kw)
    engine = tiny_engine(tok, target, draft)
    config = GenerationConfig(max_tokens=max_tokens)
    chat = ChatSession(
        engine, tok, store, config=config, context_length=context_length, models=MODELS
    )
    return chat, target, draft


def test_second_turn_prefills_only_the_new_tokens(tok, store):
    chat, target, draft = session_for(tok, store)
    first = answer(chat.send("hello there, how are you"))
    first_prompt = chat.last_prompt
    assert first.stats.prefilled_tokens == len(first_prompt)

    cached_target = list(chat.engine.target.tokens)
    cached_draft = list(chat.engine.drafter.state.tokens)
    target.reset_counts()
    draft.reset_counts()
    events = list(chat.send("tell me more"))
    second, prompt = answer(events), chat.last_prompt

    # The second prompt extends the first prompt and answer, which the caches still hold.
    assert prompt[: len(first_prompt)] == first_prompt
    assert cached_target == (first_prompt + first.tokens)[: len(cached_target)]
    assert prompt[: len(cached_target)] == cached_target
    new_tokens = len(prompt) - len(cached_target)
    assert second.stats.prefilled_tokens == new_tokens < len(prompt) // 2

    # The target processed the new tokens once, then one pass per cycle over its guesses.
    cycles = [e for e in events if isinstance(e, Cycle)]
    verified = sum(c.proposed for c in cycles) + len(cycles)
    assert target.fed == new_tokens - 1 + verified

    # The draft caught up on the new tokens only: its prefill plus what it fed while drafting.
    assert prompt[: len(cached_draft)] == cached_draft
    draft_new = len(prompt) - len(cached_draft)
    assert draft_new < len(prompt) // 2
    assert draft.fed == draft_new - 1 + sum(c.draft_fed for c in cycles)


def test_reused_caches_answer_as_a_fresh_engine_does(tok, store):
    chat, _, _ = session_for(tok, store)
    turns = ["hello", "what is speculative decoding", "and why is it lossless"]
    answers, prompts = [], []
    for text in turns:
        answers.append(answer(chat.send(text)).tokens)
        prompts.append(chat.last_prompt)
    for prompt, tokens in zip(prompts, answers):
        target, draft = tiny_pair(tok, eos_bias=-1.0)
        fresh = tiny_engine(tok, target, draft)
        assert answer(fresh.generate(prompt, chat.config)).tokens == tokens
        plain = Engine(target, tok)
        assert answer(plain.generate(prompt, chat.config)).tokens == tokens


def test_messages_and_answers_are_saved(tok, store):
    chat, _, _ = session_for(tok, store)
    done = answer(chat.send("first question"))
    answer(chat.send("second question"))
    stored = store.get(chat.conversation_id)
    assert stored.summary.title == "first question"
    assert [m.role for m in stored.messages] == ["user", "assistant"] * 2
    reply = stored.messages[1]
    assert reply.content == done.text and reply.complete
    assert reply.token_count == len(done.tokens) and reply.finish_reason == done.finish_reason
    assert reply.stats["generated_tokens"] == len(done.tokens)
    assert reply.models == MODELS
    assert chat.messages == [{"role": m.role, "content": m.content} for m in stored.messages]


def test_user_message_is_saved_before_generation(tok, store):
    chat, _, _ = session_for(tok, store)
    events = chat.send("saved first")  # nothing generated yet
    stored = store.get(chat.conversation_id).messages
    assert [(m.role, m.content, m.complete) for m in stored] == [
        ("user", "saved first", True),
        ("assistant", "", False),
    ]
    answer(events)


def test_crash_mid_answer_keeps_the_partial_answer(tok, store, monkeypatch):
    monkeypatch.setattr(session_module, "SAVE_EVERY_S", 0.0)
    chat, target, _ = session_for(tok, store, max_tokens=200, eos_bias=-1e4)
    answer(chat.send("a first turn"))
    target.crash_after = target.passes + 4  # four cycles, then the model raises
    seen = []
    with pytest.raises(RuntimeError, match="simulated crash"):
        for event in chat.send("this one crashes"):
            if isinstance(event, Token):
                seen.append(event.text)
    assert seen
    user, reply = store.get(chat.conversation_id).messages[2:]
    assert (user.role, user.content) == ("user", "this one crashes")
    assert reply.content == "".join(seen) and not reply.complete
    assert reply.finish_reason == "error" and reply.token_count == len(seen)

    # The engine's caches are still consistent: the conversation goes on.
    target.crash_after = None
    answer(chat.send("still there?"))
    assert len(store.get(chat.conversation_id).messages) == 6


def test_cancel_and_close_save_incomplete_answers(tok, store):
    chat, _, _ = session_for(tok, store, max_tokens=200, eos_bias=-1e4)
    count = 0

    def cancelled() -> bool:
        return count >= 5

    for event in chat.send("stop me", cancelled=cancelled):
        count += isinstance(event, Token)
    reply = store.get(chat.conversation_id).messages[-1]
    assert (reply.complete, reply.finish_reason, reply.token_count) == (False, "cancelled", 5)

    events = chat.send("close me")
    for event in events:
        if isinstance(event, Token):
            break
    events.close()
    reply = store.get(chat.conversation_id).messages[-1]
    assert (reply.complete, reply.finish_reason) == (False, "interrupted")
    assert chat.messages[-1]["content"] == reply.content


def test_answer_is_written_while_it_streams(tok, store, monkeypatch):
    monkeypatch.setattr(session_module, "SAVE_EVERY_S", 0.0)
    chat, _, _ = session_for(tok, store, max_tokens=100, eos_bias=-1e4)
    texts = []
    events = chat.send("stream")
    for event in events:
        if isinstance(event, Token):
            texts.append(event.text)
            if len(texts) == 10:
                break
    # Suspended mid-answer (as if the process were killed now): the row has the text so far.
    reply = store.get(chat.conversation_id).messages[-1]
    assert not reply.complete and "".join(texts).startswith(reply.content) and reply.content
    events.close()


def test_context_limit_drops_the_oldest_turns(tok, store):
    chat, _, _ = session_for(tok, store, max_tokens=16, context_length=120)
    notices = []
    for i in range(6):
        events = list(chat.send(f"question number {i}"))
        notices += [e for e in events if isinstance(e, ContextTrimmed)]
        done = answer(events)
        assert len(chat.last_prompt) + len(done.tokens) <= 120
    assert notices and "no longer sent" in notices[0].text
    assert chat.first_message > 0 and chat.messages[chat.first_message]["role"] == "user"
    assert len(chat.messages) == 12  # nothing dropped from the conversation itself
    assert len(store.get(chat.conversation_id).messages) == 12


def test_a_message_too_long_alone_is_an_error(tok, store):
    chat, _, _ = session_for(tok, store, context_length=40)
    with pytest.raises(MacspecError, match="too long"):
        chat.send("x" * 100)
    assert chat.messages == [] and chat.conversation_id is None
    assert store.list_conversations() == []
    with pytest.raises(MacspecError, match="the message is empty"):
        chat.send("")
    assert chat.messages == []


def test_a_message_of_whitespace_is_content(tok, store):
    """The rule of every path (macspec.errors.is_empty_prompt): only no characters is empty."""
    chat, _, _ = session_for(tok, store, max_tokens=4)
    answer(chat.send("  \n"))
    assert [m["content"] for m in chat.messages][:1] == ["  \n"]


def test_resume_and_new_conversation(tok, store):
    chat, _, _ = session_for(tok, store)
    answer(chat.send("remember me"))
    first_id, history = chat.conversation_id, list(chat.messages)

    chat.new_conversation()
    answer(chat.send("another chat"))
    assert chat.conversation_id != first_id

    again, _, _ = session_for(tok, store)
    again.resume(first_id)
    assert again.messages == history
    answer(again.send("go on"))
    assert len(store.get(first_id).messages) == 4
    with pytest.raises(MacspecError, match="no conversation"):
        again.resume(12345)
