"""Request bodies: read, size-checked and validated against a schema, with errors that name
the field (as OpenAI's and Anthropic's APIs do)."""

from __future__ import annotations

import json
import re
from typing import TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from macspec.serve.errors import APIError

Body = TypeVar("Body", bound=BaseModel)
UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|[a-z]+\[.*\]|[A-Z]\w*|function-\w+)$")
"""How pydantic names a union's member in an error's location."""

MAX_BODY_BYTES = 32 << 20
"""A request body larger than this is refused (413) before it is parsed."""


async def parse(request: Request, schema: type[Body]) -> Body:
    """The JSON body as `schema`, whatever the Content-Type says (curl -d sends a form type);
    a 400 naming the first bad field otherwise."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is over {MAX_BODY_BYTES >> 20} MiB")
    try:
        data = json.loads(raw)
    except ValueError:
        raise APIError(400, "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        message, param = describe(exc)
        raise APIError(400, message, param) from None


MEDIA_PARTS = {"image_url", "input_audio", "file", "image", "input_image", "input_file"}
"""Content part types of images, audio and files: a text model cannot take them."""


def describe(exc: RequestValidationError | ValidationError) -> tuple[str, str | None]:
    """A validation error as one message and the offending parameter, OpenAI-style."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    # A union field gives one error per member: the deepest one says most (a content part's
    # bad type rather than "not a string"); member names ('str', 'list[TextPart]') are dropped.
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    where = [str(p) for p in first.get("loc", ()) if p != "body" and not UNION_MEMBER.match(str(p))]
    param = ".".join(where) or None
    if first.get("type") == "missing":
        return f"missing required parameter: '{param}'", param
    kind = first.get("input")
    if where and where[-1] == "type" and kind in MEDIA_PARTS:
        return f"{param}: {kind} is not supported: macspec serves text models", param
    message = first.get("msg", "invalid value")
    return (f"invalid '{param}': {message}" if param else message), param
