"""Images in chat requests (issue 13): the torch-free engine_stub.images (sizes from real PNG and
JPEG bytes, token counts by hand, every malformed case), the chat template's placement of image
tokens, and a real engine subprocess: exact usage.prompt_tokens, prefix-cache hits for the same
image only, 400 envelopes, --image-patch/--image-merge, streaming."""
import base64
import concurrent.futures as cf
import hashlib
import importlib.util
import random
import struct
import subprocess
import sys
import zlib

import httpx
import pytest

from llm_replay.engine_stub.images import (FIRST_PLACEHOLDER, MAX_SIDE, VISION_END, VISION_START, ImageError, chat_images,
                                decode_data_url, image_size, image_token_ids, image_tokens, load_image, part_url)
from llm_replay.engine_stub.tokenizer import SPECIALS, Tokenizer
from tests.conftest import repo_env, start_engine, wait_s

TOK = Tokenizer(8192)


def png(w: int, h: int, seed: int = 0, colour: int = 2, depth: int = 8) -> bytes:
    """A real PNG (signature, IHDR, zlib-compressed IDAT, IEND) of seeded random pixels."""
    rng = random.Random(seed)
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    row = max(1, w * channels * depth // 8)
    raw = b"".join(b"\x00" + rng.randbytes(row) for _ in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0)
    plte = chunk(b"PLTE", bytes(range(48))) if colour == 3 else b""
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + plte + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def png_header(w: int, h: int) -> bytes:
    """Only the signature and a valid IHDR: all the engine reads (cheap stand-in for huge images)."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# Real JPEGs encoded by Pillow 13.0 (a test-time tool only, never an engine dependency):
# 20x10 RGB baseline (SOF0, DHT after SOF), 7x5 RGB progressive (SOF2), 33x17 greyscale with an EXIF APP1.
JPEGS = {
    (20, 10): (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABsSFBcUERsXFhceHBsgKEIrKCUlKFE6PTBCYFVlZF9VXVtqeJmBanGQc1tdhbWGkJ6jq62rZ4C8"
        "ybqmx5moq6T/2wBDARweHigjKE4rK06kbl1upKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKSkpKT/wAAR"
        "CAAKABQDASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEG"
        "E1FhByJxFDKBkaEII0KxwRVS0fAkM2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWG"
        "h4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QAHwEAAwEBAQEB"
        "AQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdhcRMiMoEIFEKRobHBCSMzUvAVYnLRChYk"
        "NOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hpanN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0"
        "tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwDG0TRotT06aZ5/IaNsb2GVxVLUbH7BqCW3"
        "nRz79pDxnIOa3fC3/Iv3v+//AEqjF/yN0P8AvR/zoA//2Q=="),
    (7, 5): (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDACgcHiMeGSgjISMtKygwPGRBPDc3PHtYXUlkkYCZlo+AjIqgtObDoKrarYqMyP/L2u71////m8H/"
        "///6/+b9//j/2wBDASstLTw1PHZBQXb4pYyl+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj/wgAR"
        "CAAFAAcDASIAAhEBAxEB/8QAFAABAAAAAAAAAAAAAAAAAAAABP/EABQBAQAAAAAAAAAAAAAAAAAAAAD/2gAMAwEAAhADEAAAAYH/xAAUEAEA"
        "AAAAAAAAAAAAAAAAAAAA/9oACAEBAAEFAn//xAAUEQEAAAAAAAAAAAAAAAAAAAAA/9oACAEDAQE/AX//xAAUEQEAAAAAAAAAAAAAAAAAAAAA"
        "/9oACAECAQE/AX//xAAUEAEAAAAAAAAAAAAAAAAAAAAA/9oACAEBAAY/An//xAAUEAEAAAAAAAAAAAAAAAAAAAAA/9oACAEBAAE/IX//2gAM"
        "AwEAAgADAAAAEP/EABQRAQAAAAAAAAAAAAAAAAAAAAD/2gAIAQMBAT8Qf//EABQRAQAAAAAAAAAAAAAAAAAAAAD/2gAIAQIBAT8Qf//EABQQ"
        "AQAAAAAAAAAAAAAAAAAAAAD/2gAIAQEAAT8Qf//Z"),
    (33, 17): (
        "/9j/4AAQSkZJRgABAQAAAQABAAD/4QA0RXhpZgAATU0AKgAAAAgAAQEOAAIAAAARAAAAGgAAAABlbmdpbmUtc3R1YiB0ZXN0AAD/2wBDACgc"
        "HiMeGSgjISMtKygwPGRBPDc3PHtYXUlkkYCZlo+AjIqgtObDoKrarYqMyP/L2u71////m8H////6/+b9//j/wAALCAARACEBAREA/8QAHwAA"
        "AQUBAQEBAQEAAAAAAAAAAAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAk"
        "M2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ip"
        "qrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/9oACAEBAAA/AMqiiiiv/9k="),
}


def jpeg(size) -> bytes:
    return base64.b64decode(JPEGS[size])


def segments(data: bytes) -> list[bytes]:
    """A JPEG's marker segments up to SOS (exclusive), each with its marker."""
    out, i = [], 2
    while data[i + 1] != 0xDA:
        n = struct.unpack(">H", data[i + 2:i + 4])[0]
        out.append(data[i:i + 2 + n])
        i += 2 + n
    return out


# ---- pure unit tests of images.py ----

@pytest.mark.parametrize("w, h, patch, merge, tokens", [
    (64, 64, 14, 2, 3 * 3 + 2),          # ceil(64/28) = 3
    (100, 30, 14, 2, 4 * 2 + 2),
    (28, 28, 14, 2, 1 + 2), (29, 28, 14, 2, 2 + 2), (1, 1, 14, 2, 1 + 2),
    (448, 448, 14, 2, 16 * 16 + 2),
    (1920, 1080, 14, 2, 69 * 39 + 2),
    (64, 64, 16, 1, 4 * 4 + 2), (100, 30, 10, 3, 4 * 1 + 2),
])
def test_image_tokens_by_hand(w, h, patch, merge, tokens):
    assert image_tokens(w, h, patch, merge) == tokens
    if (patch, merge) == (14, 2):
        assert image_tokens(w, h) == tokens


@pytest.mark.parametrize("args", [(0, 5), (5, 0), (5, 5, 0, 2), (5, 5, 14, 0)])
def test_image_tokens_rejects_nonsense(args):
    with pytest.raises(ValueError):
        image_tokens(*args)


@pytest.mark.parametrize("w, h, colour, depth", [(64, 64, 2, 8), (100, 30, 6, 8), (1, 1, 0, 1), (13, 7, 3, 4),
                                                 (9, 300, 4, 16), (MAX_SIDE, 1, 0, 1)])
def test_png_size_from_real_bytes(w, h, colour, depth):
    data = png(w, h, colour=colour, depth=depth)
    assert image_size(data) == (w, h)
    assert image_size(data_url(data)) == (w, h) and decode_data_url(data_url(data)) == data
    img = load_image(data_url(data))
    assert (img.width, img.height, img.digest) == (w, h, hashlib.sha256(data).digest())


@pytest.mark.parametrize("size", list(JPEGS))
def test_jpeg_size_from_real_bytes(size):
    data = jpeg(size)
    assert image_size(data) == size
    assert image_size(data_url(data, "image/jpeg")) == size


def test_jpeg_walk_skips_tables_before_the_frame_header_and_fill_bytes():
    data = jpeg((20, 10))
    segs = segments(data)
    sof = next(s for s in segs if s[1] == 0xC0)
    tables = [s for s in segs if s[1] == 0xC4]
    rest = data[2 + sum(map(len, segs)):]
    others = [s for s in segs if s is not sof and s[1] != 0xC4]
    # DHT (0xC4, inside the SOF range) before the frame header, plus fill bytes and a COM segment
    moved = b"\xff\xd8" + b"".join(others) + b"".join(tables) + b"\xff\xff\xff\xfe\x00\x04hi" + sof + rest
    assert image_size(moved) == (20, 10)
    # DAC (0xCC) and JPG (0xC8) are not frame headers either
    fake = b"\xff\xd8\xff\xcc\x00\x04\x00\x00\xff\xc8\x00\x08\x08\x00\x01\x00\x01\x01" + sof + rest
    assert image_size(fake) == (20, 10)


def test_jpeg_sizes_with_pillow():
    PIL = pytest.importorskip("PIL.Image")
    import io
    for (w, h), kw in [((1, 1), {}), ((333, 77), {"progressive": True}), ((MAX_SIDE, 2), {"quality": 5}),
                       ((640, 480), {"optimize": True})]:
        buf = io.BytesIO()
        PIL.new("RGB", (w, h), (10, 200, 30)).save(buf, "JPEG", **kw)
        assert image_size(buf.getvalue()) == (w, h)


def _bad_pngs():
    good = png(4, 4)
    yield "bad CRC", good[:29] + bytes(4) + good[33:]
    ihdr = bytearray(good)
    ihdr[12:16] = b"IDAT"
    yield "no IHDR first", bytes(ihdr)
    yield "truncated IHDR", good[:20]
    yield "zero width", png_header(0, 4)
    yield "zero height", png_header(4, 0)
    yield "too wide", png_header(MAX_SIDE + 1, 4)
    yield "too tall", png_header(4, 1 << 31)
    depth = bytearray(png_header(4, 4))
    depth[24] = 3                                   # bit depth 3 does not exist
    depth[29:33] = struct.pack(">I", zlib.crc32(bytes(depth[12:29])))
    yield "invalid bit depth", bytes(depth)


def _bad_jpegs():
    data = jpeg((20, 10))
    segs = segments(data)
    no_sof = b"".join(s for s in segs if s[1] != 0xC0)
    yield "no SOF before SOS", b"\xff\xd8" + no_sof + data[2 + sum(map(len, segs)):]
    yield "only SOI and EOI", b"\xff\xd8\xff\xd9"
    yield "truncated", data[:40]
    yield "garbage between segments", data[:20] + b"\x00" + data[20:]
    sof = next(s for s in segs if s[1] == 0xC0)
    zero = sof[:5] + b"\x00\x00" + sof[7:]          # height 0 (defined by a later DNL): refused
    yield "zero height", b"\xff\xd8" + zero + b"\xff\xd9"


BAD_URLS = [
    ("https URL", "https://example.com/cat.png", "https: URL"),
    ("http URL", "http://example.com/cat.png", "http: URL"),
    ("file URL", "file:///etc/passwd", "file: URL"),
    ("not a URL", "cat.png", "no URL scheme"),
    ("not base64", "data:image/png," + "%89PNG", "base64"),
    ("bad base64", "data:image/png;base64,iVBORw0KGgo!!!", "not valid base64"),
    ("bad padding", "data:image/png;base64,iVBORw0KGgoAA", "not valid base64"),
    ("not an image type", "data:text/plain;base64," + base64.b64encode(png(2, 2)).decode(), "media type"),
    ("no comma", "data:image/png;base64", "malformed"),
    ("GIF bytes", data_url(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "image/gif"), "not a PNG or JPEG"),
    ("empty data", "data:image/png;base64,", "not a PNG or JPEG"),
    ("random bytes", data_url(random.Random(3).randbytes(300)), "not a PNG or JPEG"),
] + [(f"{kind} {name}", data_url(d), "zero size" if "zero" in name else "too large" if "too" in name else kind)
     for kind, cases in [("PNG", _bad_pngs()), ("JPEG", _bad_jpegs())] for name, d in cases]


@pytest.mark.parametrize("name, url, words", BAD_URLS, ids=[b[0] for b in BAD_URLS])
def test_malformed_images_raise_a_clear_value_error(name, url, words):
    with pytest.raises(ImageError, match=words) as e:
        load_image(url)
    assert isinstance(e.value, ValueError) and str(e.value)


def test_image_url_forms_and_the_image_limit():
    url = data_url(png(3, 3))
    assert part_url({"type": "image_url", "image_url": {"url": url, "detail": "low"}}) == url
    assert part_url({"type": "image_url", "image_url": url}) == url
    for bad in ({"type": "image_url"}, {"type": "image_url", "image_url": {"detail": "high"}},
                {"type": "image_url", "image_url": {"url": 5}}):
        with pytest.raises(ImageError, match="image_url"):
            part_url(bad)
    # 65 images are refused before any of them is decoded (these URLs would not decode)
    many = [{"role": "user", "content": [{"type": "image_url", "image_url": "https://x"}] * 33}] * 2
    with pytest.raises(ImageError, match="at most 64 images per request, got 66"):
        chat_images(many)
    content = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": url}, many[0]["content"][0]]
    with pytest.raises(ImageError, match=r"messages\[1\]\.content\[2\]: only data: URLs .*, got a https: URL"):
        chat_images([{"role": "system", "content": "hi"}, {"role": "user", "content": content}])
    assert [(i.width, i.height) for i in chat_images([{"role": "user", "content": content[:2] * 3}])] == [(3, 3)] * 3


def test_placeholder_ids_hash_the_bytes():
    assert SPECIALS[VISION_START] == "<|vision_start|>" and SPECIALS[VISION_END] == "<|vision_end|>"
    assert FIRST_PLACEHOLDER == len(SPECIALS)
    a, b = hashlib.sha256(png(64, 64, seed=1)).digest(), hashlib.sha256(png(64, 64, seed=2)).digest()
    ids = image_token_ids(a, 11, 8192)
    assert ids == image_token_ids(a, 11, 8192) and len(ids) == 11
    assert ids[0] == VISION_START and ids[-1] == VISION_END
    assert all(FIRST_PLACEHOLDER <= t < 8192 for t in ids[1:-1])
    other = image_token_ids(b, 11, 8192)
    assert other[1:-1] != ids[1:-1] and image_token_ids(a, 11, 4096) != ids
    big = image_token_ids(a, 5000, 8192)
    assert big[:10] == ids[:10] and len(set(big)) > 3000      # a prefix of the same stream, spread out
    assert image_token_ids(a, 2, 8192) == [VISION_START, VISION_END]


def test_chat_prompt_puts_image_ids_at_their_place():
    img = [VISION_START, 100, 101, VISION_END]
    text_only = [{"role": "user", "content": [{"type": "text", "text": "Describe these."}]}]
    with_images = [{"role": "user", "content": [{"type": "image_url", "image_url": "data:,"},
                                                {"type": "text", "text": "Describe these."},
                                                {"type": "image_url", "image_url": "data:,"}]}]
    base = TOK.chat_prompt(text_only)
    assert TOK.chat_prompt(text_only, []) == base == TOK.chat_prompt([{"role": "user", "content": "Describe these."}])
    second = [VISION_START, 7, 102, 103, VISION_END]
    ids = TOK.chat_prompt(with_images, [img, second])
    assert len(ids) == len(base) + len(img) + len(second)
    head = TOK.encode("user\n")
    assert ids[:1 + len(head) + 4] == [3] + head + img                 # <|im_start|>user\n then the image
    text = TOK.encode("Describe these.")
    assert ids[1 + len(head) + 4:][:len(text) + len(second) + 1] == text + second + [4]   # ... then <|im_end|>


def test_images_module_imports_neither_torch_nor_fastapi():
    code = "import sys, engine_stub.images; assert not {'torch', 'fastapi', 'pydantic'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, env=repo_env(), timeout=wait_s(60))


# ---- against a real engine subprocess ----

A64 = [png(64, 64, seed=s) for s in range(4)]
B100 = [png(100, 30, seed=10 + s) for s in range(4)]


def image_part(data: bytes, mime="image/png", string_form=False) -> dict:
    url = data_url(data, mime)
    return {"type": "image_url", "image_url": url if string_form else {"url": url, "detail": "auto"}}


HTTP = httpx.Client(timeout=wait_s(60))     # one connection pool: a fresh client per request costs ~50 ms


def post(url, body):
    return HTTP.post(url + "/v1/chat/completions", json=body)


def chat(url, images, text="What is in these pictures?", **kw):
    content = [{"type": "text", "text": text}, *images]
    body = {"model": "tiny", "messages": [{"role": "system", "content": "You look at images."},
                                          {"role": "user", "content": content}],
            "max_tokens": 2, "ignore_eos": True, **kw}
    return post(url, body)


@pytest.fixture(scope="module")
def engines():
    """The default engine and one counting with --image-patch 16 --image-merge 1, started together."""
    if importlib.util.find_spec("torch") is None:   # find, not import: torch costs seconds to import
        pytest.skip("torch is not installed")
    with cf.ThreadPoolExecutor(2) as pool:
        started = [pool.submit(start_engine, "--max-model-len", "1024"),
                   pool.submit(start_engine, "--model", "micro", "--image-patch", "16", "--image-merge", "1")]
        engs = [f.result() for f in started]
    yield [e.url for e in engs]
    for e in engs:          # SIGTERM both first: they shut down side by side
        e.proc.terminate()
    for e in engs:
        e.stop()


@pytest.fixture(scope="module")
def url(engines):
    return engines[0]


def test_prompt_tokens_are_text_plus_image_tokens(url):
    base = chat(url, []).json()["usage"]["prompt_tokens"]
    assert base == len(TOK.chat_prompt([{"role": "system", "content": "You look at images."},
                                        {"role": "user", "content": "What is in these pictures?"}]))
    cases = [[], [A64[0]], [A64[1], B100[0]], [A64[2], B100[1], A64[3], B100[2]]]
    for imgs in cases:
        r = chat(url, [image_part(d, string_form=k % 2 == 1) for k, d in enumerate(imgs)])
        assert r.status_code == 200, r.text
        expected = base + sum(image_tokens(*image_size(d)) for d in imgs)
        assert r.json()["usage"]["prompt_tokens"] == expected
    assert image_tokens(64, 64) == 11 and image_tokens(100, 30) == 10
    r = chat(url, [image_part(jpeg((20, 10)), "image/jpeg"), image_part(jpeg((7, 5)), "image/jpeg")])
    assert r.json()["usage"]["prompt_tokens"] == base + 3 + 3


def _cached(r) -> int:
    return (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_same_image_hits_the_prefix_cache_a_different_one_does_not(url):
    # the image comes first, so the first block already holds image tokens: nothing before it to share
    a, b = png(200, 120, seed=100), png(200, 120, seed=101)     # same size, different bytes
    n_img = image_tokens(200, 120)                               # 8 * 5 + 2 = 42

    def ask(data):
        body = {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": [
            image_part(data), {"type": "text", "text": " Describe it."}]}]}
        return post(url, body)
    first = ask(a)
    assert first.status_code == 200 and _cached(first) == 0
    again = ask(a)
    prompt = again.json()["usage"]["prompt_tokens"]
    assert prompt == first.json()["usage"]["prompt_tokens"]
    assert prompt > 3 + n_img and _cached(again) == (prompt - 1) // 16 * 16 >= 32   # every full block but the last
    assert _cached(ask(b)) == 0


def _errors():
    yield "https URL", [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    yield "too many", [image_part(A64[0])] * 65
    yield "missing url", [{"type": "image_url", "image_url": {"detail": "low"}}]
    for name, u, _ in BAD_URLS:
        yield name, [{"type": "image_url", "image_url": {"url": u}}]


ERRORS = list(_errors())


def test_malformed_images_are_400_with_the_envelope(url):
    for name, parts in ERRORS:
        r = chat(url, parts)
        assert r.status_code == 400, (name, r.text)
        err = r.json()["error"]
        assert err["code"] == 400 and err["type"] == "BadRequestError" and err["param"] == "messages", (name, err)
        assert err["message"].startswith("invalid image: ") and "Traceback" not in err["message"], name
    r = chat(url, [{"type": "text", "text": 5}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    # an image too large for the context (8192 x 8192: 293 * 293 + 2 = 85,851 tokens) is the usual context-length 400
    r = chat(url, [image_part(png_header(8192, 8192))])
    assert r.status_code == 400 and "maximum context length is 1024 tokens" in r.json()["error"]["message"]
    big = [image_part(png(28 * 20, 28 * 20))]                          # 20 * 20 + 2 = 402 tokens
    base = chat(url, [], max_tokens=1).json()["usage"]["prompt_tokens"]
    assert chat(url, big, max_tokens=1).status_code == 200
    r = chat(url, big * 2, max_tokens=300)
    n = base + 2 * 402
    assert r.status_code == 400 and r.json()["error"]["message"].startswith(
        f"This model's maximum context length is 1024 tokens. However, you requested {n + 300} tokens "
        f"({n} in the messages, 300 in the completion).")
    assert chat(url, [image_part(A64[0])]).status_code == 200          # still serving


def test_streaming_with_images(url):
    import openai
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=wait_s(30))
    messages = [{"role": "user", "content": [{"type": "text", "text": "Compare"}, image_part(A64[0]),
                                             {"type": "text", "text": " and"}, image_part(B100[3])]}]
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 6 and chunks[-1].usage.completion_tokens == 6
    text_only = [{"role": "user", "content": "Compare and"}]
    assert chunks[-1].usage.prompt_tokens == len(TOK.chat_prompt(text_only)) + 11 + 10


def test_image_patch_and_merge_options_change_the_count(engines):
    other = engines[1]
    base = chat(other, [], model="micro").json()["usage"]["prompt_tokens"]
    r = chat(other, [image_part(A64[0]), image_part(B100[0])], model="micro")
    assert r.json()["usage"]["prompt_tokens"] == base + image_tokens(64, 64, 16, 1) + image_tokens(100, 30, 16, 1)
    assert image_tokens(64, 64, 16, 1) + image_tokens(100, 30, 16, 1) == 18 + 16 != 11 + 10
