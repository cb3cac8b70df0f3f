"""Record what an agent CLI sends to a model server: a stub server that logs every request.

Dev-only, stdlib only. Run it, point the agent at it, read the log:

    python scripts/capture/record_agent_requests.py --port 8799 --log /tmp/agent_requests.jsonl

Each request becomes one JSON line: method, path, query, headers, body (parsed JSON when it is
JSON). Every model route answers the shortest valid answer in its protocol ("ok", streamed when
asked), so the agent finishes its turn and exits:
  - Anthropic Messages: POST /v1/messages (+ /v1/messages/count_tokens);
  - OpenAI Responses: POST /v1/responses;
  - OpenAI chat completions: POST /v1/chat/completions;
  - GET /v1/models lists the model ids seen so far; anything else is 200 `{}`.
With `--call NAME ARGS_JSON` a request that offers tools and carries no tool result yet is
answered with that one tool call instead (in the same protocol), so one can see whether the agent
runs the tool without a prompt and sends its result back (the next request, in the log).
The captures under tests/fixtures/agents/ were made with it (see their `_capture` notes).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ANSWER = "ok"


def sse(event: str | None, data: dict | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def anthropic_stream(model: str, block: dict, delta: dict, stop_reason: str) -> list[bytes]:
    """One content block, whole in one delta: text ("ok") or a tool_use."""
    message = {"id": "msg_rec", "type": "message", "role": "assistant", "model": model}
    message |= {"content": [], "stop_reason": None, "stop_sequence": None}
    message["usage"] = {"input_tokens": 1, "output_tokens": 0}
    events = [
        ("message_start", {"message": message}),
        ("content_block_start", {"index": 0, "content_block": block}),
        ("content_block_delta", {"index": 0, "delta": delta}),
        ("content_block_stop", {"index": 0}),
        (
            "message_delta",
            {
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        ("message_stop", {}),
    ]
    return [sse(name, {"type": name} | data) for name, data in events]


def anthropic_text_stream(model: str) -> list[bytes]:
    text = {"type": "text_delta", "text": ANSWER}
    return anthropic_stream(model, {"type": "text", "text": ""}, text, "end_turn")


def anthropic_call_stream(model: str, name: str, args: dict) -> list[bytes]:
    block = {"type": "tool_use", "id": "toolu_rec", "name": name, "input": {}}
    delta = {"type": "input_json_delta", "partial_json": json.dumps(args)}
    return anthropic_stream(model, block, delta, "tool_use")


def anthropic_message(model: str) -> dict:
    return {
        "id": "msg_rec",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": ANSWER}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def responses_stream(model: str, item: dict, item_events: list, final_item: dict) -> list[bytes]:
    """The response frame around one output item: created, the item's own events, completed."""
    response = {"id": "resp_rec", "object": "response", "created_at": int(time.time())}
    response |= {"model": model, "status": "in_progress", "output": []}
    usage = {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0}}
    usage |= {"output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 0}}
    done = response | {
        "status": "completed",
        "output": [final_item],
        "usage": usage | {"total_tokens": 2},
    }
    events = [
        ("response.created", {"response": response}),
        ("response.in_progress", {"response": response}),
        ("response.output_item.added", {"output_index": 0, "item": item}),
        *item_events,
        ("response.output_item.done", {"output_index": 0, "item": final_item}),
        ("response.completed", {"response": done}),
    ]
    return [
        sse(name, {"type": name, "sequence_number": i} | data)
        for i, (name, data) in enumerate(events)
    ]


def responses_text_stream(model: str) -> list[bytes]:
    part = {"type": "output_text", "text": ANSWER, "annotations": []}
    item = {"id": "msg_rec", "type": "message", "role": "assistant", "status": "completed"}
    where = {"item_id": "msg_rec", "output_index": 0, "content_index": 0}
    events = [
        ("response.content_part.added", where | {"part": part | {"text": ""}}),
        ("response.output_text.delta", where | {"delta": ANSWER}),
        ("response.output_text.done", where | {"text": ANSWER}),
        ("response.content_part.done", where | {"part": part}),
    ]
    return responses_stream(model, item | {"content": []}, events, item | {"content": [part]})


def responses_call_stream(model: str, name: str, args: dict) -> list[bytes]:
    arguments = json.dumps(args)
    item = {"id": "fc_rec", "type": "function_call", "call_id": "call_rec", "name": name}
    where = {"item_id": "fc_rec", "output_index": 0}
    events = [
        ("response.function_call_arguments.delta", where | {"delta": arguments}),
        ("response.function_call_arguments.done", where | {"arguments": arguments}),
    ]
    started = item | {"arguments": "", "status": "in_progress"}
    return responses_stream(
        model, started, events, item | {"arguments": arguments, "status": "completed"}
    )


def chat_stream(model: str, delta: dict, finish_reason: str) -> list[bytes]:
    base = {"id": "chatcmpl-rec", "object": "chat.completion.chunk", "created": 0, "model": model}
    first = {"index": 0, "delta": {"role": "assistant"} | delta, "finish_reason": None}
    last = {"index": 0, "delta": {}, "finish_reason": finish_reason}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return [
        sse(None, base | {"choices": [first]}),
        sse(None, base | {"choices": [last], "usage": usage}),
        sse(None, "[DONE]"),
    ]


def chat_call_stream(model: str, name: str, args: dict) -> list[bytes]:
    call = {"index": 0, "id": "call_rec", "type": "function"}
    call["function"] = {"name": name, "arguments": json.dumps(args)}
    return chat_stream(model, {"tool_calls": [call]}, "tool_calls")


def chat_completion(model: str) -> dict:
    message = {"role": "assistant", "content": ANSWER}
    return {
        "id": "chatcmpl-rec",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def holds_tool_result(body: dict) -> bool:
    """Whether the request already carries a tool's result (in any of the three protocols)."""
    text = json.dumps(body.get("messages") or body.get("input") or [])
    return any(s in text for s in ('"tool_result"', '"function_call_output"', '"role": "tool"'))


class Recorder(BaseHTTPRequestHandler):
    log_path: Path
    lock = threading.Lock()
    models: set[str] = set()
    call: tuple[str, dict] | None = None

    def record(self, body: bytes) -> dict | str | None:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        url = urlsplit(self.path)
        entry = {
            "time": time.time(),
            "method": self.command,
            "path": url.path,
            "query": parse_qs(url.query),
            "headers": dict(self.headers.items()),
            "body": parsed,
        }
        with self.lock, self.log_path.open("a") as log:
            log.write(json.dumps(entry) + "\n")
        return parsed

    def reply_json(self, data: dict, status: int = 200) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def reply_stream(self, chunks: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(chunk)
            self.wfile.flush()
        self.close_connection = True

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("content-length") or 0)
        body = self.record(self.rfile.read(length))
        body = body if isinstance(body, dict) else {}
        model = str(body.get("model", "recorded"))
        self.models.add(model)
        path, stream = urlsplit(self.path).path, bool(body.get("stream"))
        if self.call and body.get("tools") and stream and not holds_tool_result(body):
            name, args = self.call
            if path.endswith("/messages"):
                return self.reply_stream(anthropic_call_stream(model, name, args))
            if path.endswith("/responses"):
                return self.reply_stream(responses_call_stream(model, name, args))
            if path.endswith("/chat/completions"):
                return self.reply_stream(chat_call_stream(model, name, args))
        if path.endswith("/messages/count_tokens"):
            self.reply_json({"input_tokens": 1})
        elif path.endswith("/messages"):
            if stream:
                self.reply_stream(anthropic_text_stream(model))
            else:
                self.reply_json(anthropic_message(model))
        elif path.endswith("/responses"):
            self.reply_stream(responses_text_stream(model))
        elif path.endswith("/chat/completions"):
            if stream:
                self.reply_stream(chat_stream(model, {"content": ANSWER}, "stop"))
            else:
                self.reply_json(chat_completion(model))
        else:
            self.reply_json({})

    def do_GET(self) -> None:  # noqa: N802
        self.record(b"")
        if urlsplit(self.path).path.endswith("/models"):
            ids = sorted(self.models) or ["recorded"]
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "rec"} for m in ids]
            self.reply_json({"object": "list", "data": data})
        else:
            self.reply_json({})

    def do_HEAD(self) -> None:  # noqa: N802
        self.record(b"")
        self.reply_json({})

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
        print(f"{self.command} {self.path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8799, help="port on 127.0.0.1")
    parser.add_argument("--log", type=Path, required=True, help="JSON-lines file to append to")
    parser.add_argument(
        "--call",
        nargs=2,
        metavar=("NAME", "ARGS_JSON"),
        help="answer a streamed request with tools (and no tool result yet) with this call",
    )
    args = parser.parse_args()
    Recorder.log_path = args.log
    if args.call:
        Recorder.call = (args.call[0], json.loads(args.call[1]))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Recorder)
    print(f"recording on http://127.0.0.1:{args.port} into {args.log}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
