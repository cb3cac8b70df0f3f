"""A GGUF model split into several files, as llama.cpp's `gguf-split` (and gguf-py's writer,
with its split arguments) writes one: `NAME-00001-of-00003.gguf`, ... Each part is a GGUF of its
own whose metadata says `split.no` (from 0), `split.count` and `split.tensors.count` (the whole
model's); the first part carries the model's metadata and tokenizer, each part a run of the
tensors. llama.cpp finds the parts by that name and checks each one's `split.no`; so does this,
from any part named.
"""

from __future__ import annotations

import re
from pathlib import Path

from macspec.errors import MacspecError
from macspec.models.gguf.foreign import without_foreign
from macspec.models.gguf.header import GGUFHeader, TensorEntry, read_header

PART_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
"""llama.cpp's `llama_split_path`: PREFIX-%05d-of-%05d.gguf, numbered from 1."""
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


def part_paths(path: Path) -> list[Path] | None:
    """Every part's path, first to last, when `path` is named as a part; else None."""
    match = PART_NAME.match(path.name)
    if match is None or not 1 <= int(match["no"]) <= int(match["count"]):
        return None
    count, prefix = int(match["count"]), match["prefix"]
    return [path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def first_parts(files: list[Path]) -> list[Path]:
    """`files` with each split model once: its lowest-numbered part there (the first, unless
    it is missing), in the order given."""
    seen: set[tuple[Path, str, str]] = set()
    kept: set[Path] = set()
    for file in sorted(files, key=lambda f: f.name):
        match = PART_NAME.match(file.name)
        if match is not None:
            key = (file.parent, match["prefix"], match["count"])
            if key in seen:
                continue
            seen.add(key)
        kept.add(file)
    return [f for f in files if f in kept]


def split_count(metadata: dict) -> int:
    value = metadata.get(SPLIT_COUNT, 1)
    return int(value) if isinstance(value, int) else 1


def check_parts(path: Path, metadata: dict) -> list[Path]:
    """The files of the model `path` is (one, or every part), from its name and metadata, each
    there; one line naming a part that is missing, or a name that is not a part's."""
    count = split_count(metadata)
    if count <= 1:
        return [path]
    paths = part_paths(path)
    no = metadata.get(SPLIT_NO)
    number = no + 1 if isinstance(no, int) else 1
    if paths is None or len(paths) != count:
        raise MacspecError(
            f"{path}: part {number} of {count} of a split model, but not named as its parts are "
            f"(NAME-{number:05d}-of-{count:05d}.gguf), so the others cannot be found"
        )
    for i, part in enumerate(paths, 1):
        if not part.is_file():
            raise MacspecError(
                f"{part}: missing, part {i} of {count} of the split model {paths[0].name}"
            )
    return paths


def read_model_header(path: Path, strings: bool = True) -> GGUFHeader:
    """The header of the model at `path`: one file's, or a split model's from any part named
    (the first part's metadata, every part's tensors, the parts' total size); one line naming a
    part that is missing or is not the part its name says. Tensors that are not the text
    model's (a vision tower in the same file) are left out: nothing reads or counts them."""
    named = read_header(path, strings)
    paths = check_parts(path, named.metadata)
    if len(paths) == 1:
        return without_foreign(named)
    count = len(paths)
    parts = []
    tensors: dict[str, TensorEntry] = {}
    holder: dict[str, int] = {}  # each tensor's part number
    for i, part_path in enumerate(paths):
        part = named if part_path == path else read_header(part_path, strings)
        no, total = part.metadata.get(SPLIT_NO), part.metadata.get(SPLIT_COUNT)
        if no != i or total != count:
            raise MacspecError(
                f"{part_path}: not part {i + 1} of {count} of {paths[0].name} (its split.no is "
                f"{no}, split.count {total}); a part of another model or download?"
            )
        for name, entry in part.tensors.items():
            if name in tensors:  # parts split at other tensors: another download's
                raise MacspecError(
                    f"{part_path}: part {i + 1} of {count} of another model or download than "
                    f"{paths[0].name} (its tensor {name} is in part {holder[name]} too); "
                    "download the parts again together"
                )
            tensors[name], holder[name] = entry, i + 1
        parts.append(part)
    first = parts[0]
    expected = first.metadata.get(SPLIT_TENSORS)
    if expected != len(tensors):
        raise MacspecError(
            f"{paths[0]}: its parts hold {len(tensors)} tensors, its split.tensors.count says "
            f"{expected}"
        )
    size = sum(part.size for part in parts)
    return without_foreign(GGUFHeader(
        first.path, first.version, first.metadata, tensors, first.data_start, size, tuple(parts),
        first.array_lengths, first.tokenizer_digest,
    ))  # fmt: skip
