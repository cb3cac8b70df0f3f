"""What Ollama's listings say of the pool's models: a loaded one as `ServedModel` describes it
from its weights; one not loaded from its metadata alone (/api/tags, /api/show), so listing
every model on this Mac never loads one."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

from macspec.errors import MacspecError
from macspec.models.stores.entry import is_gguf
from macspec.models.stores.ollama_mlx import manifest_json_blobs
from macspec.serve.backend import Backend
from macspec.serve.model_names import listed_name
from macspec.serve.ollama_models import FOREVER, described
from macspec.serve.servable import Servable

TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")
"""Where a model folder keeps its chat template, the first found taken."""
OLLAMA_FORMATS = {"mlx": "safetensors"}
"""Ollama's word for a format (an MLX folder or an Ollama MLX model: `safetensors`)."""


def _time(seconds: float | None) -> str:
    if seconds is None:
        return FOREVER
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def modified_at(servable: Servable) -> str:
    try:
        return _time(servable.path.stat().st_mtime) if servable.path is not None else FOREVER
    except OSError:
        return FOREVER


def details(servable: Servable) -> dict[str, Any]:
    about = servable.about
    family = (about.architecture if about else None) or "unknown"
    return {
        "parent_model": "",
        "format": OLLAMA_FORMATS.get(about.format, about.format) if about else "safetensors",
        "family": family,
        "families": [family],
        "parameter_size": "",
        "quantization_level": (about.quantization if about else None) or "",
    }


def tag(servable: Servable, backend: Backend | None) -> dict[str, Any]:
    """One entry of /api/tags (`backend`: the model's, when loaded)."""
    name = listed_name(servable.model_id)
    if backend is not None:
        entry = described(backend).listing()
    else:
        digest = hashlib.sha256(f"macspec:{servable.model_id}".encode()).hexdigest()
        size = servable.about.size_bytes if servable.about else servable.required_bytes
        entry = {"size": size, "digest": digest, "details": details(servable)}
    return {**entry, "name": name, "model": name, "modified_at": modified_at(servable)}


def running(servable: Servable, backend: Backend, expires_at: float | None) -> dict[str, Any]:
    """One entry of /api/ps: a loaded model, until `expires_at` (None: for ever)."""
    entry = described(backend).running()
    name = listed_name(servable.model_id)
    return {**entry, "name": name, "model": name, "expires_at": _time(expires_at)}


def chat_template(servable: Servable) -> str:
    """The model's chat template from its metadata: a GGUF's `tokenizer.chat_template`; a
    folder's (or an Ollama MLX manifest's JSON layers') chat_template.jinja or
    tokenizer_config.json; '' when it has none."""
    path = servable.path
    if path is None:
        return ""
    try:
        if path.is_file() and is_gguf(path):
            from macspec.models.gguf.header import read_header

            value = read_header(path).metadata.get("tokenizer.chat_template")
            return value if isinstance(value, str) else ""
        if path.is_file():  # an Ollama MLX model's manifest: its JSON layers, by file name
            files = manifest_json_blobs(path)
        else:
            files = {name: path / name for name in TEMPLATE_FILES}
        jinja = files.get("chat_template.jinja")
        if jinja is not None and jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        config_file = files.get("tokenizer_config.json")
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file else None
        value = config.get("chat_template") if isinstance(config, dict) else None
        return value if isinstance(value, str) else ""
    except (MacspecError, OSError, ValueError):
        return ""


def show(servable: Servable) -> dict[str, Any]:
    """/api/show of a model not loaded: its metadata alone."""
    about = servable.about
    template = chat_template(servable)
    arch = (about.architecture if about else None) or "unknown"
    info: dict[str, Any] = {"general.architecture": arch}
    if about is not None and about.context_length:
        info[f"{arch}.context_length"] = about.context_length
    if about is not None and about.vocab_size:
        info[f"{arch}.vocab_size"] = about.vocab_size
    capabilities = ["completion"]
    if "tools" in template:
        capabilities.append("tools")
    if "enable_thinking" in template or "<think>" in template:
        capabilities.append("thinking")
    return {
        "modelfile": f"# served by macspec\nFROM {servable.name}\n",
        "parameters": "",
        "template": template,
        "details": details(servable),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": modified_at(servable),
    }
