"""The GGUF container read directly: its metadata values and its tensors as views of one
read-only mapping of the file.

gguf-py's ``GGUFReader`` builds a numpy view for every part of every metadata value, ~100k
vocabulary strings for SmolLM2: about 5 s of every worker's start (and of every scale-up).
Reading the header with ``struct`` over the mapped file keeps the scalar and string values,
only the lengths of arrays (nothing here needs their contents: the tokenizer is converted
once and cached, model/tokenizer.py), and takes milliseconds. The tensors are laid out as
``GGUFReader`` lays them, so gguf-py's ``dequantize`` reads them unchanged.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import ModelLoadError

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # general.alignment when the file does not set it
# Metadata value types (GGUF spec, gguf-py's GGUFValueType): struct formats of the scalars.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
# Tensor types stored as plain numbers; every other type is blocks of bytes.
_PLAIN_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
                 "I16": np.int16, "I32": np.int32, "I64": np.int64}  # fmt: skip

MetadataValue = int | float | bool | str


class GGUFLoadError(ModelLoadError):
    """The GGUF file is missing, unreadable, or not a model this package can run."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    data: np.ndarray  # read-only: numbers for plain types, else rows of quantized blocks


@dataclass(frozen=True)
class GGUFFile:
    metadata: dict[str, MetadataValue]  # every scalar and string value
    array_lengths: dict[str, int]  # every array value's length (contents not read)
    tensors: list[GGUFTensor]
    data_offset: int  # where the tensors' data starts: the header's size, aligned


class _Cursor:
    """Little-endian reads at a moving offset; running past the end is a ValueError."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.offset = buffer, 0

    def _take(self, size: int) -> int:
        """Moves past ``size`` bytes that must lie in the file; where they start."""
        start = self.offset
        if start + size > len(self.buffer):
            raise ValueError("the header is truncated")
        self.offset += size
        return start

    def read(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self._take(struct.calcsize(fmt)))
        return value

    def count(self) -> int:
        return int(self.read("<Q"))

    def string(self) -> str:
        size = self.count()
        start = self._take(size)
        return self.buffer[start : start + size].decode("utf-8", errors="replace")

    def skip(self, kind: int, count: int) -> None:
        """Past ``count`` values of type ``kind``."""
        if kind == _STRING:
            for _ in range(count):
                size = self.count()  # read first: it moves the offset past itself
                self.offset += size
        elif kind == _ARRAY:
            for _ in range(count):
                item = int(self.read("<I"))
                self.skip(item, self.count())
        elif kind in _SCALAR_FORMATS:
            self.offset += struct.calcsize(_SCALAR_FORMATS[kind]) * count
        else:
            raise ValueError(f"unknown metadata value type {kind}")
        if self.offset > len(self.buffer):
            raise ValueError("the header is truncated")


def read_gguf(path: Path) -> GGUFFile:
    """The file's metadata and tensors; ``GGUFLoadError`` naming the file when it is
    missing or not a little-endian GGUF v2/v3 file whose tensors lie inside it."""
    if not path.is_file():
        raise GGUFLoadError(f"GGUF file not found: {path}")
    try:
        with path.open("rb") as f:
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:  # unreadable, or empty (mmap refuses length 0)
        raise GGUFLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    try:
        return _parse(buffer)
    except (ValueError, OverflowError, struct.error) as exc:
        raise GGUFLoadError(f"{path} is not a readable GGUF file: {exc}") from exc


def _parse(buffer: mmap.mmap) -> GGUFFile:
    cursor = _Cursor(buffer)
    if buffer[:4] != MAGIC:
        raise ValueError("no GGUF magic")
    cursor.offset = 4
    version = cursor.read("<I")
    if version not in VERSIONS:
        raise ValueError(f"version {version}: only little-endian GGUF v2/v3 is read")
    num_tensors, num_values = cursor.count(), cursor.count()
    metadata: dict[str, MetadataValue] = {}
    array_lengths: dict[str, int] = {}
    for _ in range(num_values):
        key, kind = cursor.string(), int(cursor.read("<I"))
        if kind == _STRING:
            metadata[key] = cursor.string()
        elif kind == _ARRAY:
            item, length = int(cursor.read("<I")), cursor.count()
            cursor.skip(item, length)
            array_lengths[key] = length
        elif kind in _SCALAR_FORMATS:
            metadata[key] = cursor.read(_SCALAR_FORMATS[kind])
        else:
            raise ValueError(f"metadata key {key!r} has unknown value type {kind}")
    infos = [_tensor_info(cursor) for _ in range(num_tensors)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment!r} is not a power of two")
    start = -(-cursor.offset // alignment) * alignment
    tensors = [_tensor(buffer, start, *info) for info in infos]
    if len({t.name for t in tensors}) != len(tensors):
        raise ValueError("a tensor name appears twice")
    return GGUFFile(metadata, array_lengths, tensors, start)


def _tensor_info(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cursor.string()
    num_dims = int(cursor.read("<I"))
    if num_dims > 8:
        raise ValueError(f"tensor {name} has {num_dims} dimensions")
    shape = tuple(cursor.count() for _ in range(num_dims))
    kind = int(cursor.read("<I"))
    return name, shape, kind, cursor.count()


def _tensor(
    buffer: mmap.mmap, start: int, name: str, shape: tuple[int, ...], kind: int, offset: int
) -> GGUFTensor:
    """A read-only view of one tensor, shaped as ``GGUFReader`` shapes it."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    try:
        tensor_type = GGMLQuantizationType(kind)
    except ValueError:
        raise ValueError(f"tensor {name} has unknown type {kind}") from None
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    num_elements = math.prod(shape)  # Python ints: a corrupt shape cannot wrap around
    num_bytes = num_elements * type_size // block_size
    numpy_shape = tuple(reversed(shape))
    dtype = _PLAIN_DTYPES.get(tensor_type.name)
    if dtype is None:
        dtype, count = np.uint8, num_bytes
        numpy_shape = quant_shape_to_byte_shape(numpy_shape, tensor_type)
    else:
        count = num_elements
    if start + offset + num_bytes > len(buffer):
        raise ValueError(f"tensor {name} runs past the end of the file")
    data = np.frombuffer(buffer, dtype=dtype, count=count, offset=start + offset)
    return GGUFTensor(name, tensor_type, shape, data.reshape(numpy_shape))
