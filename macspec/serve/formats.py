"""Structured outputs: each protocol's answer format as the engine's Grammar.

- OpenAI chat: `response_format` {type: json_schema, json_schema: {name, schema, strict}} or
  {type: json_object};
- Responses: `text.format` {type: json_schema, name, schema, strict} or {type: json_object};
- Anthropic: `output_config.format` (what the anthropic SDK's `messages.parse` sends) or the
  beta's top-level `output_format`, both {type: json_schema, schema}.

A format that is not one of these, or a grammar larger than the limit, is a 400 naming the
field; whether llguidance can compile the schema is checked by the backend (it needs the
model's tokenizer), a 400 with llguidance's reason.
"""

from __future__ import annotations

from typing import Any

from macspec.engine.core.grammar import Grammar
from macspec.errors import MacspecError
from macspec.serve.errors import APIError


def chat_format(response_format: dict[str, Any] | None) -> Grammar | None:
    """OpenAI chat's `response_format` as a grammar (None: free text)."""
    if not response_format:
        return None
    if not isinstance(response_format, dict):
        raise APIError(400, "response_format must be an object", "response_format")
    kind = response_format.get("type", "text")
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    if kind == "json_schema" and not isinstance(spec, dict):
        raise APIError(
            400, "response_format json_schema needs a 'json_schema' object", "response_format"
        )
    return _grammar(kind, spec, "response_format")


def responses_format(text: dict[str, Any] | None) -> Grammar | None:
    """The Responses API's `text.format` as a grammar (None: free text)."""
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if not fmt:
        return None
    if not isinstance(fmt, dict):
        raise APIError(400, "text.format must be an object", "text.format")
    return _grammar(fmt.get("type", "text"), fmt, "text.format")


def anthropic_format(
    output_config: dict[str, Any] | None, output_format: dict[str, Any] | None
) -> Grammar | None:
    """Anthropic's `output_config.format` (or the beta's `output_format`) as a grammar."""
    fmt, param = output_format, "output_format"
    config_format = (output_config or {}).get("format") if isinstance(output_config, dict) else None
    if config_format:
        fmt, param = config_format, "output_config.format"
    if not fmt:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise APIError(400, f"{param}: only {{type: json_schema, schema}} is supported", param)
    if not isinstance(fmt.get("schema"), dict):
        raise APIError(400, f"{param}.schema must be a JSON schema object", f"{param}.schema")
    return _grammar("json_schema", fmt, param)


def _grammar(kind: str, spec: dict[str, Any] | None, param: str) -> Grammar | None:
    """A format's type and its object (holding `schema`) as a grammar."""
    if kind == "text":
        return None
    try:
        if kind == "json_object":
            return Grammar("json")
        if kind == "json_schema":
            schema = (spec or {}).get("schema")
            if schema is None:  # OpenAI's schema is optional: then any JSON object
                return Grammar("json")
            if not isinstance(schema, dict):
                raise APIError(400, f"{param}: the schema must be a JSON object", param)
            return Grammar.json_schema(schema)
    except MacspecError as exc:  # too large
        raise APIError(400, str(exc), param) from None
    raise APIError(
        400,
        f"{param} type '{kind}' is not supported: send text, json_object or json_schema",
        param,
    )
