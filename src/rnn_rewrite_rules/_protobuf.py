"""The protobuf wire format, as far as reading and writing model files needs it.

One scanner for every place that reads an ONNX file below protobuf's parser: telling a
truncated file from one that is not ONNX (``_load``), leaving big tensors' bytes in the
file (``_load.lazy_model_proto``) and streaming them into one (``_save.save_embedded``).
It reads any buffer (``bytes``, ``mmap``) in place and never copies a payload.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = [
    "GRAPH_INITIALIZER",
    "LEN",
    "MODEL_FIELD_WIRE_TYPES",
    "MODEL_GRAPH",
    "TENSOR_DATA_LOCATION",
    "TENSOR_EXTERNAL_DATA",
    "TENSOR_RAW_DATA",
    "TENSOR_SEGMENT",
    "WireError",
    "encode_varint",
    "fields",
    "length_delimited",
    "length_delimited_size",
    "read_varint",
    "tag",
]

#: The wire type of length-delimited fields (messages, bytes, strings).
LEN = 2

# The field numbers of onnx.proto the callers touch.
MODEL_GRAPH = 7  # ModelProto.graph
GRAPH_INITIALIZER = 5  # GraphProto.initializer
TENSOR_SEGMENT, TENSOR_RAW_DATA = 3, 9  # TensorProto.segment, .raw_data
TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION = 13, 14  # TensorProto.external_data, .data_location
#: ModelProto's field numbers and their wire types (0 varint, 2 length-delimited).
MODEL_FIELD_WIRE_TYPES = {
    1: 0,
    2: 2,
    3: 2,
    4: 2,
    5: 0,
    6: 2,
    7: 2,
    8: 2,
    14: 2,
    20: 2,
    25: 2,
    26: 2,
}


class WireError(Exception):
    """Bytes the scanner does not follow: they end inside a field, a varint runs past 64
    bits, a tag is 0 or a group (never in ONNX); callers also raise it for a protobuf
    form they leave to the real parser."""


def read_varint(data, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``data[pos:end]`` and the position after it.

    Raises:
        WireError: it does not end before ``end``, or is longer than 64 bits.
    """
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def fields(data, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """``(field number, wire type, field start, payload start, payload end)`` of each
    field of the message at ``data[start:end]``.

    Raises:
        WireError: the bytes are not a message this scanner follows.
    """
    pos = start
    while pos < end:
        field_start = pos
        tag, pos = read_varint(data, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError
        if wire == 0:
            _, pos = read_varint(data, pos, end)
            yield number, wire, field_start, pos, pos
            continue
        if wire == 1:
            payload, pos = pos, pos + 8
        elif wire == 5:
            payload, pos = pos, pos + 4
        elif wire == LEN:
            length, payload = read_varint(data, pos, end)
            pos = payload + length
        else:  # groups: never in ONNX
            raise WireError
        if pos > end:
            raise WireError
        yield number, wire, field_start, payload, pos


def tag(number: int, wire: int = LEN) -> bytes:
    """The encoded key of field ``number`` of wire type ``wire``."""
    return encode_varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` holding ``payload``, encoded."""
    return tag(number) + encode_varint(len(payload)) + payload


def length_delimited_size(length: int) -> int:
    """Bytes of a length-delimited payload of ``length`` bytes, its length prefix included."""
    return len(encode_varint(length)) + length
