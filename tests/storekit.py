"""Fake model stores for tests: Ollama's layout exactly as Ollama writes it (manifest JSON with
`schemaVersion` 2, a config blob, layers by sha256 digest, blobs named `sha256-<hex>`), LM
Studio's folders, and tiny GGUF files written with `gguf`'s own writer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.ollama.image."


def tiny_gguf(
    path: Path,
    arch: str = "llama",
    tokens: list[str] | None = None,
    context: int = 2048,
    rows: int = 8,
    file_type: int | None = 0,
) -> Path:
    """A metadata-only GGUF file (one small float32 tensor) that readers open like a model."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(context)
    writer.add_block_count(2)
    writer.add_embedding_length(16)
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens or ["<s>", "</s>", "a", "b", "ab"])
    writer.add_tensor("token_embd.weight", np.zeros((rows, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class OllamaStore:
    """An Ollama models folder under `root` (what `OLLAMA_MODELS` names)."""

    def __init__(self, root: Path):
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "manifests").mkdir(parents=True, exist_ok=True)

    def blob(self, data: bytes) -> dict:
        """Store `data` as a blob by its sha256; the layer entry (without its media type)."""
        digest = hashlib.sha256(data).hexdigest()
        (self.root / "blobs" / f"sha256-{digest}").write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    def blob_file(self, source: Path) -> dict:
        """A large file as a blob: a symlink named by the file's sha256 (no copy)."""
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        link = self.root / "blobs" / f"sha256-{digest}"
        if not link.exists():
            link.symlink_to(source)
        return {"digest": f"sha256:{digest}", "size": source.stat().st_size}

    def add(
        self,
        name: str,
        model: Path | None = None,
        params: dict | None = None,
        template: str | None = "{{ .Prompt }}",
        extra: list[dict] | None = None,
        host: str = "registry.ollama.ai",
        namespace: str = "library",
        config: dict | None = None,
    ) -> Path:
        """A manifest `host/namespace/model/tag` with its config, model, template and params
        layers, in the order `ollama create` writes them; the manifest's path."""
        model_name, _, tag = name.partition(":")
        layers = []
        if model is not None:
            layers.append({"mediaType": LAYER + "model", **self.blob_file(model)})
        if template is not None:
            layers.append({"mediaType": LAYER + "template", **self.blob(template.encode())})
        if params is not None:
            layers.append({"mediaType": LAYER + "params", **self.blob(json.dumps(params).encode())})
        layers.extend(extra or [])
        config = {  # Ollama's ConfigV2 (`config`: what differs, an MLX model's `safetensors`)
            "model_format": "gguf",
            "model_family": "llama",
            "model_families": ["llama"],
            "model_type": "135M",
            "file_type": "Q4_1",
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
            **(config or {}),
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, **self.blob(json.dumps(config).encode())},
            "layers": layers,
        }
        path = self.root / "manifests" / host / namespace / model_name / (tag or "latest")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, separators=(",", ":")) + "\n")  # as Go's Encoder
        return path


def lmstudio_repo(home: Path, publisher: str, repo: str, older: bool = False) -> Path:
    """An (empty) LM Studio repo folder under `home`, the current or the older store."""
    root = home / (".cache/lm-studio/models" if older else ".lmstudio/models")
    folder = root / publisher / repo
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cut_gguf(source: Path, path: Path, layers: int) -> Path:
    """`source` cut to its first `layers` blocks, everything else (tokenizer, types) as it was:
    a smaller model with the same tokenizer, to pair with the whole one."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(path), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = layers if name == f"{arch}.block_count" else field.contents()
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type)
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and int(tensor.name.split(".")[1]) >= layers:
            continue
        # the reader's data is shaped in bytes per row for quantized types: the writer takes that
        data = tensor.data
        writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
