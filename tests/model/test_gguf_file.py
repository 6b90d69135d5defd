"""Our GGUF reader (model/gguf_file.py) against gguf-py's ``GGUFReader``, the reference:
the same tensors byte for byte and the same metadata, and a damaged file is always a
``GGUFLoadError`` naming it, never another exception."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from genpool_worker.model.gguf_file import GGUFLoadError, read_gguf
from genpool_worker.model.gguf_weights import find_smollm2_gguf

NUM_DAMAGED = 60


def test_smollm2_reads_as_gguf_pys_reader_reads_it() -> None:
    path = find_smollm2_gguf()
    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == reference.tensor_type, mine.name
        assert mine.shape == tuple(reference.shape.tolist()), mine.name
        assert mine.data.dtype == reference.data.dtype, mine.name
        assert mine.data.shape == reference.data.shape, mine.name
        assert np.array_equal(mine.data, reference.data), mine.name
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    arrays = {k for k, f in fields.items() if f.types[0] == gguf.GGUFValueType.ARRAY}
    assert ours.array_lengths == {k: len(fields[k].data) for k in arrays}
    scalars = {k: f.contents() for k, f in fields.items() if k not in arrays}
    assert ours.metadata.keys() == scalars.keys()
    for key, value in scalars.items():
        assert ours.metadata[key] == pytest.approx(value), key
    assert ours.array_lengths["tokenizer.ggml.tokens"] == 49152
    assert ours.data_offset == theirs.data_offset


def test_a_damaged_file_is_a_load_error_naming_it(tmp_path: Path) -> None:
    """Cut short anywhere (in the header, or in a tensor's data), or with bytes of its
    header changed: refused with the file's name, or read when the change was harmless."""
    source = find_smollm2_gguf()
    header = read_gguf(source).data_offset
    original = source.read_bytes()
    rng = random.Random(7)
    damaged = tmp_path / "damaged.gguf"
    cuts = [0, 3, 4, 8, 23, header - 1, header, header + 100, len(original) - 1]
    cuts += [rng.randrange(header) for _ in range(NUM_DAMAGED)]
    for cut in cuts:
        damaged.write_bytes(original[:cut])
        with pytest.raises(GGUFLoadError, match=re.escape(str(damaged))):
            read_gguf(damaged)
    shutil.copyfile(source, damaged)
    num_refused = 0
    for _ in range(NUM_DAMAGED):
        where = [rng.randrange(header) for _ in range(4)]
        with damaged.open("r+b") as f:  # four header bytes changed in place
            for offset in where:
                f.seek(offset)
                f.write(bytes([rng.randrange(256)]))
        try:
            read_gguf(damaged)
        except GGUFLoadError as exc:
            assert str(damaged) in str(exc)
            num_refused += 1
        with damaged.open("r+b") as f:  # and put back
            for offset in where:
                f.seek(offset)
                f.write(original[offset : offset + 1])
    assert num_refused > 0  # the changes reached lengths and types, not only text


def test_a_missing_or_empty_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(GGUFLoadError, match="GGUF file not found"):
        read_gguf(tmp_path / "absent.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GGUFLoadError, match=r"empty\.gguf is not a readable GGUF file"):
        read_gguf(tmp_path / "empty.gguf")
