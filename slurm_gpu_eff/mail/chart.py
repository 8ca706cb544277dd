"""A GPU's utilisation over its job, as a small PNG for the job-end mail: mail programs
show a PNG carried in the message (cid:), where many show no SVG. Standard library only:
a bar per timeline bucket, coloured as the report judges it, drawn into RGB rows and
written with zlib."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

WIDTH, HEIGHT = 480, 48
BACKGROUND = (243, 244, 246)
GRID = (209, 213, 219)
NO_DATA = (229, 231, 235)
# under 30%: red; under 70%: amber; else green (the report's bands)
BANDS = ((30.0, (220, 38, 38)), (70.0, (217, 119, 6)), (101.0, (22, 163, 74)))


def colour(util: float) -> tuple[int, int, int]:
    return next(rgb for top, rgb in BANDS if util < top)


def util_png(points: Sequence[float | None], width: int = WIDTH, height: int = HEIGHT) -> bytes:
    """Bars of utilisation (0-100 per bucket; None: not measured) across the width."""
    rows = [[BACKGROUND] * width for _ in range(height)]
    for y in (0, height // 2, height - 1):  # 100%, 50%, 0%
        rows[y] = [GRID] * width
    n = len(points)
    for x in range(width):
        value = points[min(n - 1, x * n // width)] if n else None
        if value is None:
            for y in range(height - 4, height - 1):
                rows[y][x] = NO_DATA
            continue
        util = max(0.0, min(100.0, float(value)))
        # at least 3 pixels: an idle stretch shows as a red line, not as nothing
        top = height - 1 - max(3, round(util / 100.0 * (height - 2)))
        rgb = colour(util)
        for y in range(max(1, top), height - 1):
            rows[y][x] = rgb
    return png(rows)


def png(rows: list[list[tuple[int, int, int]]]) -> bytes:
    height, width = len(rows), len(rows[0])
    raw = b"".join(b"\x00" + bytes(c for rgb in row for c in rgb) for row in rows)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))
