"""Generated images for multimodal requests: PNG data URLs of any size, distinct per request,
each in a few microseconds.

A target's vision encoder and its multimodal cache see the image bytes, so a replayed image
must have the trace's size, be a real decodable image, and differ between requests (identical
images would hit the server's multimodal/prefix cache, which real traffic rarely does). Encoding
a fresh PNG per request costs milliseconds, so each size's image is built once per seed and
only its last row is the request's own:

    signature, IHDR, a tEXt chunk that pads the prefix to a multiple of 3 bytes,
    IDAT 1: zlib stream of rows 0..H-2, compressed once, ending in a full flush  } constant,
    IDAT 2: the last row as a final stored deflate block + the stream's Adler-32 } per request
    IEND

The Adler-32 of the whole stream continues from the constant rows' (zlib.adler32 takes a start
value), and the prefix's base64 is computed once: base64 of bytes whose length is a multiple of
3 concatenates. The pixels are black-or-white noise per channel, which zlib stores at ~0.4 bytes
a pixel: the size of a JPEG photo of the same dimensions (512x512: ~100 KB).
"""
from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from functools import lru_cache

import numpy as np

from llm_replay.traces.schema import DEFAULT_IMAGE_PX, image_px_problem

PREFIX = b"data:image/png;base64,"


@lru_cache(maxsize=256)
def parse_px(px: str | None) -> tuple[int, int]:
    """`WxH` (a trace's `image_px`, by the trace schema's rule) as (width, height); null is
    DEFAULT_IMAGE_PX. Cached: each request names its size, few sizes repeat."""
    if problem := image_px_problem(px or DEFAULT_IMAGE_PX):
        raise ValueError(f"image_px {px!r}: {problem}")
    w, _, h = (px or DEFAULT_IMAGE_PX).partition("x")
    return int(w), int(h)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


class PngTemplate:
    """One size's constant part (built once) and `url(key)`: the data URL of image `key`."""

    def __init__(self, width: int, height: int, seed: int = 0) -> None:
        self.width, self.height = width, height
        rng = np.random.default_rng([seed & 0xFFFFFFFF, width, height])
        rows = np.zeros((height - 1, 1 + 3 * width), np.uint8)   # column 0: filter none
        rows[:, 1:] = rng.integers(0, 2, (height - 1, 3 * width), np.uint8) * 255
        raw = rows.tobytes()
        z = zlib.compressobj(6)
        stream = z.compress(raw) + z.flush(zlib.Z_FULL_FLUSH)   # ends on a byte boundary, not final
        self._adler = zlib.adler32(raw)
        head = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        idat = _chunk(b"IDAT", stream)
        pad = (-(len(head) + 12 + 8 + len(idat))) % 3
        prefix = head + _chunk(b"tEXt", b"Comment\x00" + b" " * pad) + idat
        assert len(prefix) % 3 == 0
        self.b64 = PREFIX + base64.b64encode(prefix)   # the data URL up to the request's own bytes
        self._stored = b"\x01" + struct.pack("<HH", 1 + 3 * width, (1 + 3 * width) ^ 0xFFFF)   # final stored block

    def png_suffix(self, key: bytes) -> bytes:
        """IDAT 2 and IEND for image `key`: its last row drawn from `key`."""
        row = b"\x00" + hashlib.shake_128(key).digest(3 * self.width)
        return _chunk(b"IDAT", self._stored + row + struct.pack(">I", zlib.adler32(row, self._adler))) + _IEND

    def url(self, key: bytes) -> bytes:
        """The data URL (ASCII bytes) of a PNG distinct for each `key`."""
        return self.b64 + base64.b64encode(self.png_suffix(key))

    def png(self, key: bytes) -> bytes:
        """The PNG file itself (for hosting with --image-url-base, and for tests)."""
        return base64.b64decode(self.b64[len(PREFIX):]) + self.png_suffix(key)


_IEND = _chunk(b"IEND", b"")


class Images:
    """Per-process cache of templates, one per (size, seed)."""

    def __init__(self, seed: int = 0, url_base: str | None = None) -> None:
        self.seed, self.url_base = seed, url_base.rstrip("/") if url_base else None
        self.templates: dict[tuple[int, int], PngTemplate] = {}

    def parts(self, n: int, px: str | None, key: int) -> list[bytes]:
        """Byte pieces that joined are the JSON of `n` `image_url` content parts of size `px`
        for request `key` (a row index), comma-separated: data URLs distinct per (key, image),
        or with `url_base` the hosted file of that size, `{base}/{W}x{H}.png`. Pieces, so that the
        request body is copied once, by its final join (a 512x512 image is ~170 KB of base64)."""
        size = parse_px(px)
        if self.url_base is not None:
            urls = [[f"{self.url_base}/{size[0]}x{size[1]}.png".encode()]] * n
        else:
            t = self.templates.get(size) or self.templates.setdefault(size, PngTemplate(*size, seed=self.seed))
            seed = self.seed & 0xFFFFFFFF
            urls = [[t.b64, base64.b64encode(t.png_suffix(struct.pack("<IQI", seed, key & 0xFFFFFFFFFFFFFFFF, k)))]
                    for k in range(n)]
        return [p for k, url in enumerate(urls) for p in (_OPEN if not k else b"," + _OPEN, *url, _CLOSE)]


_OPEN, _CLOSE = b'{"type":"image_url","image_url":{"url":"', b'"}}'


def main(argv: list[str] | None = None) -> int:
    """`python3 -m llm_replay.replay.images --px 512x512 [--px ...] -o DIR`: the files that
    `replay run --image-url-base` expects at `{base}/{W}x{H}.png`."""
    import argparse
    from pathlib import Path
    ap = argparse.ArgumentParser(prog="python3 -m llm_replay.replay.images", description=main.__doc__.split("\n")[0])
    ap.add_argument("--px", action="append", required=True, help="image size WxH (repeatable)")
    ap.add_argument("-o", "--out", required=True, help="directory to write WxH.png files into")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for w, h in map(parse_px, a.px):
        (Path(a.out) / f"{w}x{h}.png").write_bytes(PngTemplate(w, h, a.seed).png(b"hosted"))
        print(Path(a.out) / f"{w}x{h}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
