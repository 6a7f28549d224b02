#!/usr/bin/env python3
"""Reference outputs for onebit-image's preprocessing, from Pillow.

Reads testdata/images/chelsea.png (a 120x80 crop of scikit-image's
"chelsea", CC0; see testdata/images/LICENSE.md) and writes beside it:
- chelsea.jpg (quality 90) and chelsea.webp (lossless), the same picture
  in the other two formats, and pil/decoded-jpg.png, Pillow's decoding of
  the JPEG;
- pil/<case>.png for each case in cases.json: the picture resized as
  llama.cpp's mtmd prepares it for a tower (the target size, the
  aspect-keeping fit centred on black), every resample done by Pillow.

The target sizes are computed here from mtmd's rules with f32 rounding
emulated (struct), independently of the Rust code under test.
Run: python3 scripts/gen-image-fixtures.py  (needs Pillow, scripts/python-deps.sh)
"""
import json
import math
import os
import struct

from PIL import Image

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata", "images")
FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
           "lanczos": Image.Resampling.LANCZOS}

# name, size rule, filter. "fixed" is Gemma 3's (a square, bilinear);
# "dynamic" Qwen3-VL's (multiples of patch 16 x merge 2, bicubic).
CASES = [
    {"name": "fixed64-bilinear", "size": {"fixed": 64}, "filter": "bilinear"},
    {"name": "fixed160-bilinear", "size": {"fixed": 160}, "filter": "bilinear"},
    {"name": "fixed96-bicubic", "size": {"fixed": 96}, "filter": "bicubic"},
    {"name": "dynamic-bicubic", "size": {"dynamic": [32, 8 * 1024, 4096 * 1024]}, "filter": "bicubic"},
    {"name": "dynamic-round-bicubic", "size": {"dynamic": [32, 1024, 4096 * 1024]}, "filter": "bicubic"},
    {"name": "dynamic-max-bicubic", "size": {"dynamic": [32, 0, 4096]}, "filter": "bicubic"},
    {"name": "dynamic-min-bicubic", "size": {"dynamic": [16, 64 * 256, 1 << 22]}, "filter": "bicubic"},
    {"name": "fixed100-lanczos", "size": {"fixed": 100}, "filter": "lanczos"},
]


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def smart_size(w, h, align, lo, hi):
    f = f32(align)
    rnd = lambda x: int(round_half_away(f32(x / f))) * align
    ceil = lambda x: int(math.ceil(f32(x / f))) * align
    floor = lambda x: int(math.floor(f32(x / f))) * align
    wb, hb = max(align, rnd(f32(w))), max(align, rnd(f32(h)))
    if hi > 0 and wb * hb > hi:
        beta = f32(math.sqrt(f32(f32(f32(h) * f32(w)) / f32(hi))))
        hb, wb = max(align, floor(f32(h / beta))), max(align, floor(f32(w / beta)))
    elif lo > 0 and wb * hb < lo:
        beta = f32(math.sqrt(f32(f32(lo) / f32(f32(h) * f32(w)))))
        hb, wb = ceil(f32(h * beta)), ceil(f32(w * beta))
    return wb, hb


def round_half_away(x):
    return math.floor(x + 0.5) if x >= 0 else math.ceil(x - 0.5)


def fit(img, tw, th, flt):
    w, h = img.size
    if (w, h) == (tw, th):
        return img.copy()
    scale = min(f32(f32(tw) / f32(w)), f32(f32(th) / f32(h)))
    nw = min(max(1, math.ceil(f32(f32(w) * scale))), tw)
    nh = min(max(1, math.ceil(f32(f32(h) * scale))), th)
    inner = img.resize((nw, nh), resample=flt)
    canvas = Image.new("RGB", (tw, th), (0, 0, 0))
    canvas.paste(inner, ((tw - nw) // 2, (th - nh) // 2))
    return canvas


def main():
    src = Image.open(os.path.join(HERE, "chelsea.png")).convert("RGB")
    os.makedirs(os.path.join(HERE, "pil"), exist_ok=True)
    src.save(os.path.join(HERE, "chelsea.jpg"), quality=90)
    src.save(os.path.join(HERE, "chelsea.webp"), lossless=True)
    Image.open(os.path.join(HERE, "chelsea.jpg")).convert("RGB").save(
        os.path.join(HERE, "pil", "decoded-jpg.png"))
    out = []
    for c in CASES:
        if "fixed" in c["size"]:
            tw = th = c["size"]["fixed"]
        else:
            tw, th = smart_size(*src.size, *c["size"]["dynamic"])
        fit(src, tw, th, FILTERS[c["filter"]]).save(os.path.join(HERE, "pil", c["name"] + ".png"))
        out.append(dict(c, target=[tw, th]))
    with open(os.path.join(HERE, "cases.json"), "w") as f:
        json.dump({"pillow": Image.__version__, "source": "chelsea.png", "cases": out}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
