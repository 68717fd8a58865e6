"""replay.images and image rows in request bodies: every image is a valid PNG of the row's size
(decoded here with a stdlib PNG reader that checks every CRC and the zlib stream), distinct per
request and per image, the same for the same seed and row."""
from __future__ import annotations

import base64
import json
import struct
import zlib

import pytest

from llm_replay.replay import plan
from llm_replay.replay.images import Images, PngTemplate, parse_px
from llm_replay.replay.prompts import PromptBuilder
from tests.conftest import run_cli


def decode_png(png: bytes) -> tuple[int, int, bytes]:
    """(width, height, filtered scanlines) of an 8-bit RGB PNG; asserts every chunk CRC."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, kinds = 8, b"", []
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", png[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + data), kind
        kinds.append(kind)
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", data[:10])
            assert (depth, color) == (8, 2)
        elif kind == b"IDAT":
            idat += data
        pos += 12 + n
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and pos == len(png)
    raw = zlib.decompress(idat)           # checks the deflate stream and its Adler-32
    assert len(raw) == h * (1 + 3 * w) and all(raw[r * (1 + 3 * w)] == 0 for r in range(h))
    return w, h, raw


def from_url(url: str) -> bytes:
    head, _, data = url.partition(",")
    assert head == "data:image/png;base64"
    return base64.b64decode(data, validate=True)


@pytest.mark.parametrize("w,h", [(512, 512), (64, 64), (100, 30), (1, 1), (3, 1), (1, 5)])
def test_png_template_images_decode_and_differ(w, h):
    t = PngTemplate(w, h, seed=7)
    a, b = from_url(t.url(b"a").decode()), from_url(t.url(b"b").decode())
    (wa, ha, ra), (wb, hb, rb) = decode_png(a), decode_png(b)
    assert (wa, ha) == (wb, hb) == (w, h) and ra != rb
    assert ra[:-(1 + 3 * w)] == rb[:-(1 + 3 * w)]        # only the last row is the request's own
    assert from_url(PngTemplate(w, h, seed=7).url(b"a").decode()) == a == t.png(b"a")
    if w * h >= 64 * 64:    # noise: about as large as a JPEG photo of this size
        assert 0.3 < len(a) / (w * h) < 0.6


def test_images_decode_with_pillow():
    Image = pytest.importorskip("PIL.Image")
    import io
    t = PngTemplate(100, 30, seed=2)
    img = Image.open(io.BytesIO(from_url(t.url(b"k").decode())))
    img.load()                                    # decodes every pixel
    assert img.size == (100, 30) and img.mode == "RGB" and img.format == "PNG"


def test_parse_px():
    assert parse_px(None) == (512, 512) and parse_px("1024x768") == (1024, 768)
    for bad in ("512", "0x10", "9000x10", "axb"):
        with pytest.raises(ValueError, match="image_px"):
            parse_px(bad)


def row(idx, images, px=None, prompt="describe these"):
    r = [None] * plan.ROW_LEN
    r[plan.IDX], r[plan.RID], r[plan.SCHED], r[plan.IN], r[plan.OUT] = idx, str(idx), 0.0, 12, 4
    r[plan.PROMPT], r[plan.IMAGES], r[plan.IMAGE_PX] = prompt, images, px
    return tuple(r)


def builder(**kw) -> PromptBuilder:
    return PromptBuilder(plan.RunConfig(trace="t", target="http://x", run_dir="r", prompt_mode="ids", **kw))


def parts(body: bytes) -> list:
    msg = json.loads(body)["messages"][-1]
    return msg["content"]


def test_body_carries_the_rows_images_as_content_parts():
    b = builder(seed=3)
    path, body, sized, text = b.body(row(5, 3, "64x40"), "m", "chat")
    # the row's own text: nothing sized from the calibration's words
    assert path == "/v1/chat/completions" and text == "describe these" and sized == (0, 0)
    content = parts(body)
    assert content[0] == {"type": "text", "text": "describe these"} and len(content) == 4
    pngs = [from_url(p["image_url"]["url"]) for p in content[1:]]
    assert all(p["type"] == "image_url" for p in content[1:])
    assert [decode_png(p)[:2] for p in pngs] == [(64, 40)] * 3 and len(set(pngs)) == 3
    # the same row and seed: the same bytes; another row: other images; null size: 512x512
    assert b.body(row(5, 3, "64x40"), "m", "chat")[1] == body
    other = [from_url(p["image_url"]["url"]) for p in parts(b.body(row(6, 3, "64x40"), "m", "chat")[1])[1:]]
    assert not set(other) & set(pngs)
    assert decode_png(from_url(parts(b.body(row(7, 1), "m", "chat")[1])[1]["image_url"]["url"]))[:2] == (512, 512)
    assert parts(b.body(row(8, 0), "m", "chat")[1]) == "describe these"      # no images: plain text


def test_image_url_base_and_the_files_it_expects(tmp_path):
    b = builder(image_url_base="http://img.local/px/")
    content = parts(b.body(row(1, 2, "300x200"), "m", "chat")[1])
    assert [p["image_url"]["url"] for p in content[1:]] == ["http://img.local/px/300x200.png"] * 2
    p = run_cli("replay.images", "--px", "300x200", "--px", "8x8", "-o", tmp_path)
    assert p.returncode == 0, p.stderr
    assert decode_png((tmp_path / "300x200.png").read_bytes())[:2] == (300, 200)
    assert decode_png((tmp_path / "8x8.png").read_bytes())[:2] == (8, 8)


def test_images_cache_one_template_per_size():
    im = Images(seed=1)
    im.parts(2, "32x32", 1)
    im.parts(1, "32x32", 2)
    im.parts(1, None, 3)
    assert set(im.templates) == {(32, 32), (512, 512)}
