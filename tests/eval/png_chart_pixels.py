"""Pixel statistics of a PNG screenshot, for the report render test. Decodes the PNG itself
(zlib + the five PNG row filters, numpy for speed) so that no imaging package is needed.

usage: png_chart_pixels.py SHOT.png BOXES.json RRGGBB
BOXES.json: [[x, y, w, h], ...] in pixels. Prints JSON: width, height, nonwhite (pixels not
near-white), line_total (pixels drawn in colour RRGGBB, antialiased onto the chart
background) and line_per_box (those inside each box).
"""
import json
import struct
import sys
import zlib

import numpy as np


def decode_png(data):
    """8-bit RGB / RGBA, non-interlaced (what Chromium writes) -> uint8 array [H, W, C]."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit("not a PNG file")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, color, _, _, interlace = header
    ch = {2: 3, 6: 4}.get(color)
    if depth != 8 or ch is None or interlace != 0:
        raise SystemExit(f"unsupported PNG: depth {depth}, colour type {color}, interlace {interlace}")
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, 1 + width * ch)
    out = np.zeros((height, width * ch), dtype=np.uint8)
    prev = np.zeros(width * ch, dtype=np.uint8)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:]
        if kind == 0:  # None
            cur = line.copy()
        elif kind == 1:  # Sub: running sum along each channel, mod 256
            cur = np.cumsum(line.reshape(width, ch), axis=0, dtype=np.uint8).reshape(-1)
        elif kind == 2:  # Up
            cur = line + prev
        else:  # Average, Paeth: each byte depends on the one to its left
            cur = bytearray(line.tobytes())
            up = prev.tolist()
            for i in range(len(cur)):
                a = cur[i - ch] if i >= ch else 0
                b = up[i]
                if kind == 3:
                    cur[i] = (cur[i] + (a + b) // 2) & 255
                else:
                    c = up[i - ch] if i >= ch else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.frombuffer(bytes(cur), dtype=np.uint8)
        out[y] = cur
        prev = out[y]
    return out.reshape(height, width, ch)[:, :, :3]


def main():
    with open(sys.argv[1], "rb") as f:
        rgb = decode_png(f.read()).astype(np.int32)
    with open(sys.argv[2]) as f:
        boxes = json.load(f)
    want = np.array([int(sys.argv[3][i:i + 2], 16) for i in (0, 2, 4)], dtype=np.float64)
    # The 1.5 px line is antialiased onto the chart background (#fafafa): a pixel it covers
    # by a fraction a is background + a * (line - background). A pixel counts as line when it
    # lies on that blend (within 20 levels) with a >= 0.4; every column the line crosses has
    # one (its 1.5 px of coverage is split over at most three pixels).
    bg = np.array([250.0, 250.0, 250.0])
    d = want - bg
    alpha = ((rgb - bg) @ d) / (d @ d)
    off = np.linalg.norm(rgb - bg - alpha[..., None] * d, axis=2)
    line = (alpha >= 0.4) & (alpha <= 1.1) & (off <= 20)
    per_box = []
    for bx, by, bw, bh in boxes:
        x0, y0 = int(round(bx)), int(round(by))
        per_box.append(int(line[y0:y0 + int(round(bh)), x0:x0 + int(round(bw))].sum()))
    print(json.dumps({"width": int(rgb.shape[1]), "height": int(rgb.shape[0]),
                      "nonwhite": int((rgb.min(axis=2) < 235).sum()), "line_total": int(line.sum()),
                      "line_per_box": per_box}))


if __name__ == "__main__":
    main()
