"""The safetensors container format, enough to write valid files and to check them like a loader does.

A file is an 8-byte little-endian header length, a JSON header mapping tensor names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the data section), then the data.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I32": 4, "I64": 8, "F8_E4M3": 1}
MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """The bytes are not a valid safetensors file."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return DTYPE_BYTES[self.dtype] * math.prod(self.shape)


def build_header(tensors: list[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The length prefix and JSON header for ``tensors`` laid out back to back, padded to 8 bytes."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


@dataclass(frozen=True)
class ParsedHeader:
    tensors: dict[str, dict]
    metadata: dict[str, str]
    header_bytes: int
    data_bytes: int

    @property
    def file_bytes(self) -> int:
        return 8 + self.header_bytes + self.data_bytes


def header_length(prefix: bytes) -> int:
    """The JSON header length announced by the first 8 bytes of a file."""
    if len(prefix) < 8:
        raise SafetensorsError("file is shorter than the 8-byte header length prefix")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length == 0 or length > MAX_HEADER_BYTES:
        raise SafetensorsError(f"header length {length} is out of range")
    return length


def parse_header(head: bytes) -> ParsedHeader:
    """Parse and check the header at the start of a file (``head`` holds at least prefix plus header)."""
    length = header_length(head)
    raw = head[8 : 8 + length]
    if len(raw) < length:
        raise SafetensorsError("file ends inside its header")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise SafetensorsError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    end = 0
    for name, info in header.items():
        try:
            dtype, shape, (begin, stop) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"tensor {name!r} lacks dtype, shape or data_offsets") from None
        if dtype not in DTYPE_BYTES:
            raise SafetensorsError(f"tensor {name!r} has unknown dtype {dtype!r}")
        if stop - begin != DTYPE_BYTES[dtype] * math.prod(shape):
            raise SafetensorsError(f"tensor {name!r} spans {stop - begin} bytes, its shape needs another size")
        end = max(end, stop)
    return ParsedHeader(tensors=header, metadata=metadata, header_bytes=length, data_bytes=end)
