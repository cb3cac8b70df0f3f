"""An answer the server itself ended (a shutdown that would not wait for it) is told apart
from a whole one in every protocol that has a word for it: OpenAI's finish_reason
'cancelled', the Responses API's status 'cancelled' (its message item 'incomplete')."""

from __future__ import annotations

from macspec.engine.core.events import Done
from macspec.engine.core.stats import Stats
from macspec.serve.render import finish_reason
from macspec.serve.responses import status_of


def done(reason: str) -> Done:
    return Done(finish_reason=reason, text="", tail="", tokens=[], sources=[], stats=Stats())


def test_openai_finish_reasons():
    assert finish_reason(done("cancelled")) == "cancelled"
    assert finish_reason(done("cancelled"), called=True) == "cancelled"
    assert finish_reason(done("stop")) == "stop" and finish_reason(done("stop_string")) == "stop"
    assert finish_reason(done("length")) == finish_reason(done("context")) == "length"


def test_responses_status():
    assert status_of(done("cancelled")) == "cancelled"
    assert status_of(done("length")) == "incomplete" and status_of(done("stop")) == "completed"
