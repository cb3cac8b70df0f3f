"""LM Studio's store, read in place: `~/.lmstudio/models/<publisher>/<repo>/` (and the older
`~/.cache/lm-studio/models`), each repo folder holding GGUF files (several quantizations may
sit side by side) or an MLX model folder (config.json and safetensors)."""

from __future__ import annotations

from pathlib import Path

from macspec.errors import MacspecError
from macspec.models.gguf.split import first_parts
from macspec.models.stores.entry import StoreModel, require_gguf

PREFIX = "lmstudio:"
FORM = "lmstudio:PUBLISHER/REPO[/FILE.gguf]"


def store_roots() -> list[Path]:
    """LM Studio's model folders, the current one first."""
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def is_mlx_folder(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def is_projector(file: Path) -> bool:
    """A vision projector LM Studio keeps beside the model (`mmproj-*.gguf`)."""
    return file.name.lower().startswith("mmproj")


def model_files(folder: Path) -> list[Path]:
    """The GGUF model files of a repo folder (projectors left out), by name, a split model
    once (its first part)."""
    return first_parts(
        sorted(f for f in folder.glob("*.gguf") if f.is_file() and not is_projector(f))
    )


def repos(root: Path) -> list[Path]:
    """Every `<publisher>/<repo>` folder under one root."""
    return sorted(p for p in root.glob("*/*") if p.is_dir()) if root.is_dir() else []


def resolve(spec: str, given: str | None = None) -> StoreModel:
    """The model `PUBLISHER/REPO[/FILE.gguf]` names in LM Studio's store; when both roots hold
    the repo the current one is taken, and a note says so."""
    given = given or spec
    parts = spec.split("/")
    if len(parts) not in (2, 3) or not all(parts) or any(p in (".", "..") for p in parts):
        raise MacspecError(f"{given}: not an LM Studio model name ({FORM})")
    roots = store_roots()
    holding = [
        root / parts[0] / parts[1] for root in roots if (root / parts[0] / parts[1]).is_dir()
    ]
    if not holding:
        where = " or ".join(str(root) for root in roots)
        raise MacspecError(f"{given}: not in LM Studio's store ({where})")
    folder = holding[0]
    notes = (
        [f"{given} is in {', '.join(map(str, holding))}; using {folder}"]
        if len(holding) > 1
        else []
    )
    if any(is_projector(f) for f in folder.glob("*.gguf")):
        notes.append(f"{given} has a vision projector: the text model runs, images are not read")
    if len(parts) == 3:
        return StoreModel(
            given, "lmstudio", require_gguf(folder / parts[2], given, "file"), notes=tuple(notes)
        )
    if is_mlx_folder(folder):
        return StoreModel(given, "lmstudio", folder, notes=tuple(notes))
    files = model_files(folder)
    if len(files) == 1:
        return StoreModel(
            given, "lmstudio", require_gguf(files[0], given, "file"), notes=tuple(notes)
        )
    if not files:
        raise MacspecError(f"{given}: {folder} holds no GGUF file and no MLX model")
    names = ", ".join(f.name for f in files)
    raise MacspecError(
        f"{given}: {folder} holds {len(files)} GGUF files; name one as {given}/FILE.gguf ({names})"
    )
