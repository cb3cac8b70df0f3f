"""A cut GGUF header and a split model's part from another download are said in plain words:
where the file ends, and that the part is another model's, never Python's internals."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from ggufkit import tiny_gguf, write_gguf
from test_gguf_files import CONFIGS, random_model

from macspec.errors import MacspecError
from macspec.models.gguf.header import read_header
from macspec.models.gguf.split import read_model_header
from macspec.models.stores.header import read_header as read_listing_header


@pytest.mark.parametrize("where", ["keys", "vocabulary", "tensor table"])
def test_a_cut_header_says_where_the_file_ends(tmp_path: Path, where: str):
    whole = tiny_gguf(tmp_path, Q.Q4_1)
    cut = {"keys": 30, "vocabulary": 1000, "tensor table": read_header(whole).data_start - 64}
    path = tmp_path / "cut.gguf"
    path.write_bytes(whole.read_bytes()[: cut[where]])
    said = f"{path}: truncated GGUF header (the file ends at byte {cut[where]}; an incomplete "
    readers = [read_header, read_model_header]
    if where != "tensor table":  # a listing reads no tensor table
        readers.append(read_listing_header)
    for read in readers:
        with pytest.raises(MacspecError) as caught:
            read(path)
        assert str(caught.value) == said + "download?)"


def test_a_part_of_another_download_is_said_to_be_one(tmp_path: Path):
    """The same model split at 8 and at 7 tensors a part (21 tensors: 3 parts either way):
    the other download's third part, under this one's name, repeats tensors of its second."""
    config = CONFIGS["llama"]
    model = random_model(config, seed=3)
    (tmp_path / "mine").mkdir()
    (tmp_path / "other").mkdir()
    first = write_gguf(model, config, tmp_path / "mine" / "m.gguf", split_max_tensors=8)
    write_gguf(model, config, tmp_path / "other" / "m.gguf", split_max_tensors=7)
    third = first.with_name("m-00003-of-00003.gguf")
    (tmp_path / "other" / third.name).replace(third)
    with pytest.raises(MacspecError) as caught:
        read_model_header(first)
    said = str(caught.value)
    assert said.startswith(f"{third}: part 3 of 3 of another model or download than {first.name}")
    assert "is in part 2 too" in said and "download the parts again together" in said
    assert "\n" not in said


@pytest.mark.parametrize("field, at", [("tensor count", 8), ("key count", 16)])
def test_a_whole_file_with_a_damaged_count_is_called_damaged_not_cut(
    tmp_path: Path, field: str, at: int
):
    """Flipped bytes in a count make a whole file look as if it ran on past its end: that is
    said as damage (the count), not as an incomplete download."""
    data = bytearray(tiny_gguf(tmp_path, Q.Q4_1).read_bytes())
    data[at : at + 4] = b"\xff" * 4
    path = tmp_path / "flipped.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(MacspecError, match="damaged GGUF header") as caught:
        read_header(path)
    assert "truncated" not in str(caught.value) and field.split()[0] in str(caught.value)
