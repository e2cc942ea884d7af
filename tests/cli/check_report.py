#!/usr/bin/env python3
"""Checks for tests/cli/report.sh, written from the formats (HTML, SVG, PNG, JSON lines), not
from examples/report.cpp.

  check_report.py html PAGE N_PLOTS [LABEL ...]   N_PLOTS <svg class="plot"> with finite
                                                   coordinates inside their viewBox, drawn
                                                   lines, the tables, nothing loaded from outside
  check_report.py png FILE WIDTH HEIGHT COLOR ...  a valid PNG (chunk CRCs, zlib) of that size,
                                                   not blank, with pixels of each #rrggbb COLOR
  check_report.py log FILE (real|synthetic)        sum of time/*_ms = perf/step_ms on every line;
                                                   data_wait > 0 somewhere (real) / == 0 (synthetic)
Exits 1 with a message on the first failed check.
"""
import html.parser
import json
import math
import re
import struct
import sys
import zlib


def fail(msg):
    print("check_report: FAIL: " + msg)
    sys.exit(1)


# ---- HTML -------------------------------------------------------------------------------------

class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.plots = []      # one dict per <svg class="plot">
        self.cur = None
        self.tags = []       # every start tag (name, attrs)
        self.text = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "svg" and a.get("class") == "plot":
            vb = [float(x) for x in a["viewbox"].split()]  # html.parser lower-cases attribute names
            self.cur = {"id": a.get("id"), "viewbox": vb, "coords": [], "shapes": 0, "points": 0}
            self.plots.append(self.cur)
        elif self.cur is not None:
            if tag in ("polyline", "polygon"):
                pts = a.get("points", "").split()
                self.cur["shapes"] += 1
                self.cur["points"] += len(pts)
                for p in pts:
                    x, y = p.split(",")
                    self.cur["coords"].append((tag, float(x), float(y)))
            elif tag == "circle":
                self.cur["shapes"] += 1
                self.cur["points"] += 1
                self.cur["coords"].append((tag, float(a["cx"]), float(a["cy"])))
            elif tag == "line":
                self.cur["coords"] += [(tag, float(a["x1"]), float(a["y1"])), (tag, float(a["x2"]), float(a["y2"]))]

    def handle_endtag(self, tag):
        if tag == "svg":
            self.cur = None

    def handle_data(self, data):
        self.text.append(data)


def check_html(path, n_plots, labels):
    src = open(path, encoding="utf-8").read()
    page = Page()
    page.feed(src)
    if len(page.plots) != n_plots:
        fail(f"{path}: {len(page.plots)} plots, expected {n_plots}: {[p['id'] for p in page.plots]}")
    for p in page.plots:
        _, _, w, h = p["viewbox"]
        if p["shapes"] == 0 or p["points"] < 2:
            fail(f"{path}: plot {p['id']} draws nothing ({p['shapes']} shapes, {p['points']} points)")
        for tag, x, y in p["coords"]:
            if not (math.isfinite(x) and math.isfinite(y)):
                fail(f"{path}: plot {p['id']}: non-finite coordinate in <{tag}>: {x},{y}")
            if not (-1 <= x <= w + 1 and -1 <= y <= h + 1):
                fail(f"{path}: plot {p['id']}: <{tag}> point {x},{y} outside the viewBox {w}x{h}")
    # self-contained: no scripts, stylesheets, images, frames or URLs to fetch
    for tag, a in page.tags:
        if tag in ("script", "link", "img", "iframe", "object", "embed"):
            fail(f"{path}: has a <{tag}> element; the page must load nothing")
        for k, v in a.items():
            if k in ("src", "href") and v and not v.startswith("#"):
                fail(f"{path}: <{tag} {k}={v!r}> loads something")
    if re.search(r"url\(\s*['\"]?(https?:|//)", src) or "@import" in src:
        fail(f"{path}: CSS fetches a URL")
    text = " ".join(page.text)
    for phase in ("data_wait", "forward", "backward", "optimizer", "other", "total"):
        if phase not in text:
            fail(f"{path}: the breakdown table lacks '{phase}'")
    for label in labels:
        if label not in text:
            fail(f"{path}: run label '{label}' is not on the page")
    for title in ("Loss", "Learning rate", "Gradient norm", "Throughput", "Memory", "Summary"):
        if title not in text:
            fail(f"{path}: no '{title}' section")
    print(f"check_report: {path}: {len(page.plots)} plots, "
          f"{sum(len(p['coords']) for p in page.plots)} finite coordinates, self-contained")


# ---- PNG (ISO/IEC 15948; W3C PNG spec, sections 5, 9, 11) ---------------------------------------

def decode_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG (signature)")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        ctype = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(ctype + body) & 0xFFFFFFFF != crc:
            fail(f"{path}: bad CRC in chunk {ctype!r}")
        if ctype == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif ctype == b"IDAT":
            idat += body
        elif ctype == b"IEND":
            break
        pos += 12 + length
    if ihdr is None:
        fail(f"{path}: no IHDR")
    w, h, depth, color, _, _, interlace = ihdr
    if depth != 8 or color not in (2, 6) or interlace != 0:
        fail(f"{path}: unsupported PNG (depth {depth}, colour type {color}, interlace {interlace})")
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    if len(raw) != h * (stride + 1):
        fail(f"{path}: image data has {len(raw)} bytes, expected {h * (stride + 1)}")
    rows, prev = [], bytearray(stride)
    for r in range(h):
        f = raw[r * (stride + 1)]
        line = bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif f != 0:
                fail(f"{path}: bad filter type {f} in row {r}")
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def check_png(path, width, height, colors):
    w, h, bpp, rows = decode_png(path)
    if (w, h) != (width, height):
        fail(f"{path}: {w}x{h}, expected {width}x{height}")
    hist = {}
    for row in rows:
        for i in range(0, len(row), bpp):
            px = row[i:i + 3]
            hist[px] = hist.get(px, 0) + 1
    background, bg_count = max(hist.items(), key=lambda kv: kv[1])
    ink = 1 - bg_count / (w * h)
    if len(hist) < 50 or ink < 0.05:
        fail(f"{path}: looks blank ({len(hist)} colours, {100 * ink:.1f}% differ from the background)")
    for c in colors:
        rgb = tuple(int(c.lstrip("#")[k:k + 2], 16) for k in (0, 2, 4))
        near = sum(n for px, n in hist.items() if max(abs(px[k] - rgb[k]) for k in range(3)) <= 12)
        if near < 300:
            fail(f"{path}: only {near} pixels of colour {c}: were the plot lines drawn?")
        print(f"check_report: {path}: {near} pixels of {c}")
    print(f"check_report: {path}: {w}x{h} PNG, {len(hist)} colours, {100 * ink:.1f}% ink")


# ---- JSON lines from train_gpt --------------------------------------------------------------------

def check_log(path, kind):
    n, data_wait = 0, []
    for line in open(path, encoding="utf-8"):
        rec = json.loads(line)
        if "perf/step_ms" not in rec:
            continue  # validation lines
        n += 1
        phases = sum(v for k, v in rec.items() if k.startswith("time/") and k.endswith("_ms"))
        if abs(phases - rec["perf/step_ms"]) > 1e-6 * max(1.0, rec["perf/step_ms"]):
            fail(f"{path}: step {rec['step']}: phases sum to {phases} ms, step_ms is {rec['perf/step_ms']}")
        data_wait.append(rec["time/data_wait_ms"])
    if n == 0:
        fail(f"{path}: no step lines")
    if kind == "synthetic" and any(x != 0 for x in data_wait):
        fail(f"{path}: --synthetic-data run has data_wait > 0 at {sum(x != 0 for x in data_wait)} steps")
    if kind == "real" and not any(x > 0 for x in data_wait):
        fail(f"{path}: a run reading a file never waited for data (data_wait all 0)")
    print(f"check_report: {path}: {n} steps, phases sum to step_ms, data_wait total {sum(data_wait):.3f} ms ({kind})")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "html" and len(sys.argv) >= 4:
        check_html(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif cmd == "png" and len(sys.argv) >= 5:
        check_png(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
    elif cmd == "log" and len(sys.argv) == 4:
        check_log(sys.argv[2], sys.argv[3])
    else:
        print(__doc__)
        sys.exit(2)
