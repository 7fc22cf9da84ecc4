"""A minimal line plot written as PNG with zlib and struct (no plotting library needed).

Enough for a campaign report: axes, a light grid, up to a few series, and numeric labels for the axis
extremes drawn with a 3x5 digit font.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

_FONT = {  # 3x5 glyphs, rows top to bottom, bits left to right
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), ".": (0, 0, 0, 0, 2), "s": (0, 3, 4, 1, 6),
    "k": (4, 5, 6, 5, 5), "M": (5, 7, 7, 5, 5), " ": (0, 0, 0, 0, 0),
}
COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]


def encode_png(rgb: np.ndarray) -> bytes:
    """An 8-bit RGB image (height, width, 3) as PNG bytes."""
    height, width, _ = rgb.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), rgb.reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
            + chunk(b"IEND", b""))


def _text(canvas: np.ndarray, x: int, y: int, text: str, color=(60, 60, 60), scale: int = 2) -> None:
    for index, char in enumerate(text):
        glyph = _FONT.get(char, _FONT[" "])
        for row, bits in enumerate(glyph):
            for col in range(3):
                if bits >> (2 - col) & 1:
                    y0, x0 = y + row * scale, x + (index * 4 + col) * scale
                    canvas[max(y0, 0):y0 + scale, max(x0, 0):x0 + scale] = color


def _short(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _line(canvas: np.ndarray, xs: np.ndarray, ys: np.ndarray, color) -> None:
    """Connect consecutive points with vertical/horizontal-interpolated segments (vectorized per segment)."""
    for (x0, y0), (x1, y1) in zip(zip(xs[:-1], ys[:-1]), zip(xs[1:], ys[1:])):
        steps = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        t = np.linspace(0, 1, steps + 1)
        px = np.round(x0 + (x1 - x0) * t).astype(int)
        py = np.round(y0 + (y1 - y0) * t).astype(int)
        for dy in (0, 1):
            canvas[np.clip(py + dy, 0, canvas.shape[0] - 1), np.clip(px, 0, canvas.shape[1] - 1)] = color


def line_plot(times, series: list, width: int = 720, height: int = 360) -> np.ndarray:
    """Series (each a sequence over ``times``) normalized to their own maximum, drawn over shared axes;
    the left label is the first series' maximum, the bottom label the last time in seconds."""
    canvas = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 56, 16, 16, 32
    plot_w, plot_h = width - left - right, height - top - bottom
    for fraction in (0.25, 0.5, 0.75, 1.0):
        canvas[top + int(plot_h * (1 - fraction)), left:left + plot_w] = (230, 230, 230)
    canvas[top:top + plot_h + 1, left] = (0, 0, 0)
    canvas[top + plot_h, left:left + plot_w + 1] = (0, 0, 0)
    times = np.asarray(times, dtype=np.float64)
    if len(times) >= 2 and times[-1] > times[0]:
        xs = left + (times - times[0]) / (times[-1] - times[0]) * plot_w
        for index, values in enumerate(series):
            values = np.asarray(values, dtype=np.float64)
            peak = values.max() if len(values) and values.max() > 0 else 1.0
            ys = top + plot_h - values / peak * plot_h
            _line(canvas, xs, ys, COLORS[index % len(COLORS)])
        first = np.asarray(series[0], dtype=np.float64) if series else np.zeros(1)
        _text(canvas, 4, top, _short(float(first.max()) if len(first) else 0.0), COLORS[0])
        _text(canvas, 4, top + plot_h - 10, "0")
        _text(canvas, left + plot_w - 40, top + plot_h + 8, _short(float(times[-1] - times[0])) + "s")
    return canvas


def write_plot(path, times, series: list) -> None:
    with open(path, "wb") as handle:
        handle.write(encode_png(line_plot(times, series)))
