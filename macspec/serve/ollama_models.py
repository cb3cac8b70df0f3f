"""The served model as Ollama describes its models: `/api/tags`, `/api/ps` and `/api/show`
(details, model_info from the target's config, the chat template, the parameters, the
capabilities), and the names a client may call it by (Ollama's `name:tag`, `latest` by default).
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from macspec.errors import MacspecError
from macspec.models.gguf.folder import gguf_source
from macspec.models.gguf.header import GGUFHeader, read_header
from macspec.models.reasoning import has_think_tags
from macspec.models.stores.describe import Description, file_type_name
from macspec.models.tools import HARMONY
from macspec.serve.backend import Backend
from macspec.serve.errors import APIError
from macspec.serve.model_names import listed_name

STARTED = datetime.now(timezone.utc)
"""When the server loaded its model: what `modified_at` says."""
FIM_TOKENS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Qwen3
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SmolLM
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)
"""Fill-in-the-middle tokens, prefix-suffix-middle order, by model family."""
FOREVER = "2318-08-20T00:00:00Z"
"""`expires_at` of a model kept loaded (what Ollama says for keep_alive -1)."""


def now() -> str:
    """Ollama's `created_at`: RFC 3339 in UTC."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


_DESCRIBED: WeakKeyDictionary[Backend, ServedModel] = WeakKeyDictionary()


def described(backend: Backend) -> ServedModel:
    """The backend's description, computed once while it is loaded."""
    found = _DESCRIBED.get(backend)
    if found is None:
        found = _DESCRIBED[backend] = ServedModel(backend)
    return found


class ServedModel:
    """What Ollama's listings say about the backend's model (computed once)."""

    def __init__(self, backend: Backend):
        self.backend = backend

    @property
    def name(self) -> str:
        """The name `/api/tags` lists, with a tag as Ollama's names have."""
        return listed_name(self.backend.model_id)

    def check(self, name: str) -> None:
        """Ollama's 404 for a model this server does not serve (any name with --any-model)."""
        try:
            self.backend.check_model(name)
        except APIError:
            raise APIError(404, f"model '{name}' not found", "model") from None

    @cached_property
    def target(self):
        engine = self.backend.engine
        target = getattr(engine, "target", None)
        return getattr(target, "model", None) or getattr(engine, "model", None)

    @cached_property
    def gguf(self) -> GGUFHeader | None:
        """The header of the GGUF file served (a `.gguf` path, an Ollama blob), or None."""
        for name in sorted(self.backend.aliases):
            path = Path(name)
            source = gguf_source(path) if path.is_dir() else None
            if source is None and name.endswith(".gguf") and path.is_file():
                source = path
            if source is not None:
                try:
                    return read_header(source, strings=False)
                except MacspecError:  # moved or damaged since loading: described as loaded
                    return None
        return None

    @cached_property
    def tensor_manifest(self) -> Description | None:
        """An Ollama MLX model (its folder derived from a tensor-layer manifest) as its
        manifest describes it (Ollama's `file_type`, the architecture), or None."""
        from macspec.models.stores.listing import describe_path
        from macspec.models.stores.ollama_entry import tensor_entry

        for name in sorted(self.backend.aliases):
            path = Path(name)
            if path.is_dir() and tensor_entry(path) is not None:
                try:
                    return describe_path(path)
                except (MacspecError, OSError, ValueError):  # gone since loading
                    return None
        return None

    @cached_property
    def config(self) -> dict[str, Any]:
        """The target's model arguments (mlx-lm's ModelArgs), as a dict."""
        args = getattr(self.target, "args", None)
        if args is None:
            return {}
        items = vars(args) if hasattr(args, "__dict__") else {}
        return {k: v for k, v in items.items() if isinstance(v, (int, float, str, bool))}

    @cached_property
    def weights(self) -> tuple[int, int, int | None, str]:
        """(parameters, bytes, bits of quantized layers or None, dtype of the rest)."""
        from mlx.utils import tree_flatten

        if self.target is None:
            return 0, 0, None, "unknown"
        params = tree_flatten(self.target.parameters())
        size = sum(a.nbytes for _, a in params)
        bits = None
        count = 0
        dtypes: dict[str, int] = {}
        quantized = {}
        for path, module in self.target.named_modules():
            if getattr(module, "bits", None) and hasattr(module, "scales"):
                quantized[path] = module.bits
        for path, array in params:
            owner, _, leaf = path.rpartition(".")
            if owner in quantized and leaf == "weight":
                bits = quantized[owner]
                count += array.size * 32 // bits  # packed into uint32
            elif not (owner in quantized and leaf in ("scales", "biases")):
                count += array.size
                dtypes[str(array.dtype)] = dtypes.get(str(array.dtype), 0) + array.size
        dtype = max(dtypes, key=dtypes.get) if dtypes else "unknown"
        return count, size, bits, dtype.removeprefix("mlx.core.")

    @property
    def family(self) -> str:
        """GGUF's `general.architecture` (`gemma3`, not mlx-lm's `gemma3_text`), as Ollama."""
        if self.gguf is not None and "general.architecture" in self.gguf.metadata:
            return self.gguf.architecture
        return str(self.config.get("model_type") or "unknown")

    @property
    def format(self) -> str:
        if self.gguf is not None:
            return "gguf"
        if self.tensor_manifest is not None:  # Ollama's own word for its MLX models
            return "safetensors"
        names = (self.backend.model_id, *self.backend.aliases)
        gguf = any(n.endswith(".gguf") or n.startswith("ollama:") for n in names)
        return "gguf" if gguf else "safetensors"

    @property
    def quantization_level(self) -> str:
        """Ollama's: the GGUF's `general.file_type` (`Q4_K_M`), else its commonest tensor
        type; an Ollama MLX model's `file_type` (`int4`, `nvfp4`); a model folder's quantized
        bits (`Q4`) or float type."""
        if self.tensor_manifest is not None and self.tensor_manifest.quantization:
            return self.tensor_manifest.quantization
        if self.gguf is not None:
            named = file_type_name(self.gguf.metadata.get("general.file_type"))
            if named and not named.startswith("type "):
                return named
            counts: dict[str, int] = {}
            for tensor in self.gguf.tensors.values():
                counts[tensor.qtype.name] = counts.get(tensor.qtype.name, 0) + tensor.nbytes
            if counts:
                return max(counts, key=counts.get)
        _, _, bits, dtype = self.weights
        return f"Q{bits}" if bits else {"float32": "F32", "float16": "F16"}.get(dtype, "BF16")

    def details(self) -> dict[str, Any]:
        count = self.weights[0]
        level = self.quantization_level
        return {
            "parent_model": "",
            "format": self.format,
            "family": self.family,
            "families": [self.family],
            "parameter_size": parameter_size(count),
            "quantization_level": level,
        }

    @cached_property
    def digest(self) -> str:
        """A stable id of what is served (Ollama's is its manifest's sha256)."""
        return hashlib.sha256(f"macspec:{self.backend.model_id}".encode()).hexdigest()

    def listing(self) -> dict[str, Any]:
        """One entry of /api/tags."""
        return {
            "name": self.name,
            "model": self.name,
            "modified_at": STARTED.isoformat().replace("+00:00", "Z"),
            "size": self.weights[1],
            "digest": self.digest,
            "details": self.details(),
        }

    def running(self) -> dict[str, Any]:
        """One entry of /api/ps: loaded for as long as the server runs, in unified memory."""
        entry = self.listing()
        del entry["modified_at"]
        return {
            **entry,
            "expires_at": FOREVER,
            "size_vram": entry["size"],
            "context_length": self.backend.context_length or 0,
        }

    def model_info(self) -> dict[str, Any]:
        """GGUF-style keys (general.*, <arch>.*) from the target's config."""
        arch, config = self.family, self.config
        info: dict[str, Any] = {
            "general.architecture": arch,
            "general.parameter_count": self.weights[0],
        }
        keys = {
            "context_length": ("max_position_embeddings",),
            "embedding_length": ("hidden_size",),
            "block_count": ("num_hidden_layers",),
            "feed_forward_length": ("intermediate_size",),
            "attention.head_count": ("num_attention_heads",),
            "attention.head_count_kv": ("num_key_value_heads",),
            "attention.layer_norm_rms_epsilon": ("rms_norm_eps",),
            "rope.freq_base": ("rope_theta",),
            "vocab_size": ("vocab_size",),
        }
        for key, names in keys.items():
            for name in names:
                if config.get(name) is not None:
                    info[f"{arch}.{key}"] = config[name]
                    break
        return info

    @cached_property
    def can_think(self) -> bool:
        """Whether the model reasons apart (think tags, gpt-oss's channels) or its template
        switches thinking."""
        tokenizer = self.backend.tokenizer
        template = getattr(tokenizer, "chat_template", None)
        switch = isinstance(template, str) and "enable_thinking" in template
        return switch or has_think_tags(tokenizer) or self.backend.tool_format is HARMONY

    @cached_property
    def fill_in_the_middle(self) -> tuple[str, str, str] | None:
        """The model's (prefix, suffix, middle) tokens, when its tokenizer has them."""
        tokenizer = self.backend.tokenizer
        for tokens in FIM_TOKENS:
            try:
                if all(len(tokenizer.encode(t, add_special_tokens=False)) == 1 for t in tokens):
                    return tokens
            except Exception:  # a tokenizer that cannot say has no such tokens
                return None
        return None

    def insert_prompt(self, prompt: str, suffix: str) -> str:
        """Ollama's `suffix`: the prompt to fill in between `prompt` and `suffix`; a 400 for a
        model without a fill-in-the-middle format."""
        if self.fill_in_the_middle is None:
            raise APIError(
                400,
                f'"{self.backend.model_id}" does not support insert: its tokenizer has no '
                "fill-in-the-middle tokens; send the request without suffix",
                "suffix",
            )
        before, after, middle = self.fill_in_the_middle
        return f"{before}{prompt}{after}{suffix}{middle}"

    def capabilities(self) -> list[str]:
        caps = ["completion"]
        if self.backend.tool_format is not None:
            caps.append("tools")
        if self.fill_in_the_middle is not None:
            caps.append("insert")
        if self.can_think:
            caps.append("thinking")
        return caps

    def parameters(self) -> str:
        """The server's defaults, as Ollama's Modelfile parameter lines."""
        d = self.backend.defaults
        lines = [
            ("temperature", d.temperature),
            ("top_p", d.top_p),
            ("top_k", d.top_k),
            ("min_p", d.min_p),
            ("num_predict", d.max_tokens),
        ]
        if self.backend.context_length:
            lines.append(("num_ctx", self.backend.context_length))
        if d.seed is not None:
            lines.append(("seed", d.seed))
        lines += [("stop", json.dumps(stop)) for stop in d.stop]  # Ollama quotes each
        return "\n".join(f"{name:<30} {value}" for name, value in lines)

    def show(self) -> dict[str, Any]:
        """The body of /api/show."""
        template = getattr(self.backend.tokenizer, "chat_template", None) or ""
        return {
            "modelfile": f"# served by macspec\nFROM {self.backend.model_id}\n",
            "parameters": self.parameters(),
            "template": template if isinstance(template, str) else "",
            "details": self.details(),
            "model_info": self.model_info(),
            "capabilities": self.capabilities(),
            "modified_at": STARTED.isoformat().replace("+00:00", "Z"),
        }


def parameter_size(count: int) -> str:
    """Ollama's way: '135.0M', '7.6B'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)


def nanoseconds(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def elapsed_ns(since: float) -> int:
    return nanoseconds(time.perf_counter() - since)
