"""The usage report's HTML page in a real browser: Debian's Chromium, headless, takes a
screenshot of the page, and the screenshot shows the page (tables and the SVG charts in
their colours), not a blank or an error page. No cluster needed. The page has no script
(test_usage_html checks), so what Chromium draws is what a browser without JavaScript
draws. (Chromium's own switch for that, --blink-settings=scriptEnabled=false, also stops
its headless screenshot: Chromium 156 writes none.)

GPUEFF_SCREENSHOT_DIR=DIR keeps the screenshot (usage-page.png) for a person to look at."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import time
import zlib
from pathlib import Path

from slurm_gpu_eff.report import charts
from slurm_gpu_eff.report.render import render_usage
from tests.integration.conftest import fail_or_skip
from tests.unit.test_usage_html import sample_data

WIDTH, HEIGHT = 1400, 2400
TIMEOUT_S = 120


def screenshot(page: Path, png: Path, profile: Path, size: tuple[int, int] = (WIDTH, HEIGHT)) -> None:
    """Chromium, headless. --no-sandbox: CI runs as root. Its own session, so
    that a hang (a page that blocks it) is killed whole, helpers included."""
    chromium = shutil.which("chromium")
    if not chromium:
        fail_or_skip("chromium is not installed (scripts/install-deps.sh installs Debian's)")
        return
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={size[0]},{size[1]}",
               page.as_uri()]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"chromium took over {TIMEOUT_S} s:\n{out[-3000:]}") from None
    assert proc.returncode == 0 and png.exists(), f"chromium failed ({proc.returncode}):\n{out[-3000:]}"


def png_rows(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height, and the rows of RGB pixels that decode without the PNG filters that
    need a whole pass in Python (Average, Paeth): rows filtered None or Sub, and the rows
    filtered Up below one of those. About a third of a page's rows, spread down it: enough
    to see what is on it, in a fraction of a second."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, bytearray(), b""
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + size
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour_type in (2, 6), (depth, colour_type)
    bpp = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(bytes(idat)), width * bpp
    assert len(raw) == height * (stride + 1)
    low, high = int.from_bytes(b"\x7f" * stride, "big"), int.from_bytes(b"\x80" * stride, "big")
    rows, above = [], None
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:  # Sub: each byte plus the one a pixel to its left
            for x in range(bpp, stride):
                line[x] = (line[x] + line[x - bpp]) & 0xFF
        elif kind == 2 and above is not None:  # Up: plus the row above, bytewise, mod 256
            a, b = int.from_bytes(line, "big"), int.from_bytes(above, "big")
            line = bytearray((((a & low) + (b & low)) ^ ((a ^ b) & high)).to_bytes(stride, "big"))
        elif kind != 0:
            above = None
            continue
        above = bytes(line)
        rows.append(above if bpp == 3 else bytes(v for i, v in enumerate(above) if i % 4 != 3))
    return width, height, rows


def colours(rows: list[bytes]) -> set[tuple[int, int, int]]:
    return {(r[i], r[i + 1], r[i + 2]) for r in rows for i in range(0, len(r), 3)}


def near(found: set[tuple[int, int, int]], hex_colour: str, tolerance: int = 8) -> bool:
    want = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return any(all(abs(a - b) <= tolerance for a, b in zip(c, want, strict=True)) for c in found)


def test_the_page_in_headless_chromium(tmp_path: Path) -> None:
    page = tmp_path / "usage.html"
    page.write_text(render_usage(sample_data(), "html"), encoding="utf-8")
    png = tmp_path / "usage-page.png"
    started = time.monotonic()
    screenshot(page, png, tmp_path / "profile")
    took = time.monotonic() - started
    keep = os.environ.get("GPUEFF_SCREENSHOT_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copyfile(png, Path(keep) / "usage-page.png")
    assert png.stat().st_size > 50_000, png.stat().st_size  # a blank page of this size: ~10 KB
    width, height, rows = png_rows(png)
    assert (width, height) == (WIDTH, HEIGHT)
    assert len(rows) > height // 5, len(rows)  # enough rows to judge from
    seen = colours(rows)
    assert len(seen) > 200, len(seen)  # text, tables and charts, antialiased: many colours
    # the charts were drawn: the used bars, the idle bucket, and a busy bucket
    for colour in (charts.USED, charts.BUCKET_COLOURS[0], charts.BUCKET_COLOURS[-1]):
        assert near(seen, colour), f"no {colour} on the page"
    print(f"chromium screenshot in {took:.1f} s, {png.stat().st_size} bytes, {len(seen)} colours")
