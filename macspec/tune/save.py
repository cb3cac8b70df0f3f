"""Writing the tuned draft: a staging folder renamed into place when complete, and its pair.

Nothing appears at `--out` until the model is whole: a crash or Ctrl-C leaves no trace
beside it either (the staging folder is removed on the way out).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import mlx.nn as nn

from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.catalog import SHIPPED_CATALOG, is_pair_name, parse_catalog
from macspec.models.gguf.folder import GGUF_KEY, gguf_entry
from macspec.models.home import read_toml, user_catalog_path
from macspec.tune.train import quantized_layers

WEIGHT_FILES = ("*.safetensors", "model.safetensors.index.json", "*.bin", "*.gguf", "*.pt")
"""The draft's files the tuned weights replace; everything else (config, tokenizer, chat
template, generation config) is copied as it is."""
FINDER_FILES = {".DS_Store"}
"""Files macOS puts in any folder opened in the Finder: a folder of only these is empty."""
MARGIN_BYTES = 16 * 2**20
"""Free space asked for beyond the estimate."""


def check_out(out: Path, force: bool, protected: tuple[Path, ...] = ()) -> None:
    """`--out` may be written: absent, or with --force an earlier tuned draft (a folder with a
    tune.json) or an empty folder, and none of `protected`. --force never replaces a folder
    of other files: a mistyped --out must not cost the user their data."""
    resolved = out.expanduser().resolve()
    for path in protected:
        if resolved == path.resolve():
            raise MacspecError(f"--out {out} is one of the models being tuned; pick another")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise MacspecError(f"--out {out} exists and is not a folder")
        try:
            earlier_draft = (out / "tune.json").is_file()
            others = [p for p in out.iterdir() if p.name not in FINDER_FILES]
        except OSError as exc:
            raise MacspecError(f"--out {out}: cannot read it ({exc.strerror or exc})") from None
        if others and not earlier_draft:
            raise MacspecError(
                f"--out {out} already exists and holds files that macspec tune did not write "
                "(no tune.json; --force replaces only an earlier tuned draft): pick another folder"
            )
        if not force:
            raise MacspecError(f"--out {out} already exists (pass --force to replace it)")


def needed_bytes(draft: Path) -> int:
    """Room to write the tuned draft: its weights twice (the model and, while training, an
    adapter or checkpoint of at most its size) plus a margin."""
    return 2 * hub.size_on_disk(draft) + MARGIN_BYTES


def check_disk(out: Path, needed: int) -> None:
    """Room for the tuned draft where --out will be made; a place that cannot be written at
    all is said to be that, not short of space."""
    nearest = hub.nearest_existing(out.expanduser().parent)
    try:  # a probe, not os.access: root passes that check on read-only and pseudo filesystems
        os.rmdir(tempfile.mkdtemp(prefix=".macspec-probe-", dir=nearest))
    except OSError as exc:
        raise MacspecError(f"--out {out}: cannot write in {nearest} ({exc.strerror})") from None
    free = hub.free_disk_bytes(out)
    if needed > free:
        raise MacspecError(
            f"not enough disk space for --out {out}: needs {needed / 1e6:.1f} MB, "
            f"{free / 1e6:.1f} MB free"
        )


@contextmanager
def staging(out: Path, force: bool) -> Iterator[Path]:
    """A fresh folder beside `out` to write into; renamed to `out` when the block ends well
    (replacing the old `out` with --force), removed whatever happens otherwise."""
    parent = out.expanduser().resolve().parent
    created = [p for p in (parent, *parent.parents) if not p.exists()]
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{out.name}.tuning-", dir=parent))
    old = folder / "replaced"
    try:
        yield folder / "model"
        if out.exists() and force:
            os.replace(out, old)  # the old model moves aside only now (and goes below)
        os.replace(folder / "model", out)
    except BaseException:
        if old.exists() and not out.exists():
            os.replace(old, out)  # the new one could not take its place: put it back
        shutil.rmtree(folder, ignore_errors=True)
        for path in created:  # folders made for --out's parent, innermost first
            try:
                path.rmdir()
            except OSError:
                break
        raise
    shutil.rmtree(folder, ignore_errors=True)


def copy_draft_files(draft: Path, folder: Path, tuned: nn.Module) -> None:
    """The draft's config, tokenizer and other files, byte for byte (weights excepted). A
    draft read from a GGUF file gets a config of its own: its derived config names the file
    (which would load the file's weights, not the tuned ones) and leaves the quantization to
    the loader; the tuned folder is a plain mlx-lm folder with its quantization written."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in sorted(draft.iterdir()):
        if file.is_file() and not any(file.match(p) for p in WEIGHT_FILES):
            shutil.copyfile(file, folder / file.name)  # follows the HF cache's symlinks
    if gguf_entry(draft) is None:
        return
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.pop(GGUF_KEY, None)
    config.pop("quantization", None)
    config.update(quantization_of(tuned))
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def quantization_of(model: nn.Module) -> dict:
    """mlx-lm's `quantization` entry for a model as it is: the first quantized layer's settings
    as the default, each layer's own beside them; {} for a float model."""
    per_module = quantized_layers(model)
    if not per_module:
        return {}
    first = next(iter(per_module.values()))
    return {"quantization": {**first, **per_module}}


# -- registering the pair ------------------------------------------------------------------


def check_register_name(name: str) -> None:
    """A valid pair name that the user's models.toml does not have yet."""
    if not is_pair_name(name):
        raise MacspecError(
            f"--register {name!r}: a pair name is lowercase letters, digits, '.', '_' or '-'"
        )
    if shadows_shipped(name):
        raise MacspecError(
            f"--register {name}: the shipped catalog has a pair '{name}'; pick another name"
        )
    path = user_catalog_path()
    if path.is_file() and name in parse_catalog(read_toml(path), path):
        raise MacspecError(f"--register {name}: {path} already has a pair '{name}'")


def pair_entry(
    name: str, target: str, draft: Path, policy: str | int, context_length: int, size_bytes: int
) -> dict:
    """The [[pair]] table for a target and its tuned draft."""
    return {
        "name": name,
        "target": target,
        "draft": str(draft.resolve()),
        "draft_policy": policy,
        "context_length": context_length,
        "description": f"{target} with a draft tuned on its answers by macspec tune",
        "size_gb": round(size_bytes / 1e9, 3),
    }


def register_pair(entry: dict) -> Path:
    """Append the pair to the user's models.toml (written whole, then renamed into place);
    returns the file. The result is parsed back before it replaces the old file."""
    path = user_catalog_path()
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    lines = ["[[pair]]"] + [f"{key} = {_toml_value(value)}" for key, value in entry.items()]
    text = old + ("\n" if old and not old.endswith("\n\n") else "") + "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    try:
        parse_catalog(read_toml(temporary), path)
    except MacspecError:
        temporary.unlink()
        raise
    os.replace(temporary, path)
    return path


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    return str(value)


def shadows_shipped(name: str) -> bool:
    """Whether a user pair of this name replaces one of the shipped catalog."""
    return name in parse_catalog(read_toml(SHIPPED_CATALOG), SHIPPED_CATALOG)


def write_record(folder: Path, config, resolved, settings, result, draft_config) -> None:
    """tune.json beside the weights: where the draft came from and what it measured."""
    record = {
        "target": resolved.target_name,
        "draft": resolved.draft_name,
        "pair": resolved.pair.name if resolved.pair is not None else None,
        "prompts": str(config.prompts) if config.prompts else "history",
        "held_out": str(config.held_out) if config.held_out else "split",
        "train_prompts": result.train_prompts,
        "held_out_prompts": result.held_out_prompts,
        "answer_tokens": result.answer_tokens,
        "training": {
            **asdict(settings),
            "method": result.method,
            "method_chosen_by": "the draft's size" if config.full is None else "the user",
            "draft_parameters": result.draft_parameters,
            "trainable": result.trainable,
        },
        "quantization": draft_config.get("quantization"),
        "stopping": result.training.to_dict() if result.training else None,
        "train_s": round(result.train_s, 1),
        "peak_memory_bytes": result.peak_memory_bytes,
        "before": result.before.to_dict(),
        "after": result.after.to_dict(),
        "better": result.better,
        "verdict": result.verdict,
        "change_in_tokens_per_pass": dict(zip(("mean", "standard_error"), result.change)),
        "identical_greedy_outputs": result.identical,
    }
    (folder / "tune.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
