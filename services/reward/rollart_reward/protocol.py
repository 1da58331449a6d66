"""Frames between the service and its pool workers: a 4-byte big-endian length, then a JSON object.

The worker speaks on a private duplicate of its original stdout; its fd 1 is pointed at stderr so that a
library that prints cannot corrupt the stream.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024


class FrameError(RuntimeError):
    pass


def encode(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise FrameError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(data)) + data


def _decode(data: bytes) -> dict[str, Any]:
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise FrameError("frame is not a JSON object")
    return obj


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame, or None at a clean end of stream (the peer closed between frames)."""
    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("stream ended inside a frame header") from None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    try:
        return _decode(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        raise FrameError("stream ended inside a frame") from None


def read_frame_sync(stream: BinaryIO) -> dict[str, Any] | None:
    head = stream.read(HEADER.size)
    if not head:
        return None
    if len(head) < HEADER.size:
        raise FrameError("stream ended inside a frame header")
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    data = stream.read(size)
    if len(data) < size:
        raise FrameError("stream ended inside a frame")
    return _decode(data)


def write_frame_sync(stream: BinaryIO, obj: dict[str, Any]) -> None:
    stream.write(encode(obj))
    stream.flush()
