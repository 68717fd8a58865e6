"""Image inputs of chat requests, counted the way a vision-language model served by vLLM counts them.

A chat message may carry OpenAI content parts `{"type": "image_url", "image_url": {"url": ...}}`
(or `"image_url": "<url>"`). The engine has no network, so only `data:` URLs with base64 PNG or
JPEG bytes are accepted. It never decodes pixels: the size comes from the PNG IHDR chunk or the
JPEG SOF segment, read with the stdlib (no Pillow in the engine), and the number of tokens from
the size, by patches as Qwen2-VL does:

    tokens = ceil(W / (patch * merge)) * ceil(H / (patch * merge)) + 2   (vision start and end)

The placeholder ids between the two markers are drawn from a hash of the image bytes: the same
image gives the same ids, so it hits the prefix cache, and different images never share a
block, as vLLM mixes a hash of each multimodal input into its prefix-cache keys.

This module imports neither torch nor fastapi: the load generator and the tests import
`image_tokens` to predict `usage.prompt_tokens`.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import zlib
from dataclasses import dataclass

from .config import check_range

PATCH = 14                  # ViT patch side in pixels (Qwen2-VL)
MERGE = 2                   # spatial merge: merge x merge patches become one token
MAX_SIDE = 8192             # pixels a side; anything larger is refused, not counted
MAX_IMAGES = 64             # per request
# The tokenizer's special ids (tokenizer.SPECIALS): images are wrapped in <|vision_start|> ...
# <|vision_end|>, and placeholder ids are drawn from [FIRST_PLACEHOLDER, vocab), above every special.
VISION_START, VISION_END = 5, 6
FIRST_PLACEHOLDER = 8

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# valid (colour type: bit depths) pairs of the PNG spec
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# SOF0..SOF15 are 0xC0..0xCF except DHT (C4), JPG (C8) and DAC (CC), which share the range
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# markers without a length field: TEM, RST0..7, SOI
_JPEG_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8), 0xD8])


class ImageError(ValueError):
    """An image part the engine cannot accept; the server answers 400 with this message."""


def image_tokens(width: int, height: int, patch: int = PATCH, merge: int = MERGE) -> int:
    """Prompt tokens of one width x height image: one per (patch*merge)^2 cell, plus the
    vision start and end markers."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if patch < 1 or merge < 1:
        raise ValueError(f"patch and merge must be >= 1, got {patch} and {merge}")
    cell = patch * merge
    return -(-width // cell) * -(-height // cell) + 2


@dataclass(frozen=True)
class ImageOptions:
    """How the server counts image tokens (`--image-patch`, `--image-merge`)."""
    patch: int = PATCH
    merge: int = MERGE

    def __post_init__(self) -> None:
        check_range(self, "image-", "patch merge", 1)


@dataclass(frozen=True)
class Image:
    """An accepted image: its size and the sha256 of its decoded bytes."""
    width: int
    height: int
    digest: bytes

    def tokens(self, opts: ImageOptions = ImageOptions()) -> int:
        return image_tokens(self.width, self.height, opts.patch, opts.merge)

    def token_ids(self, vocab_size: int, opts: ImageOptions = ImageOptions()) -> list[int]:
        return image_token_ids(self.digest, self.tokens(opts), vocab_size)


def is_image_part(part: object) -> bool:
    """True for an OpenAI `image_url` content part (the tokenizer puts its ids at its place)."""
    return isinstance(part, dict) and part.get("type") == "image_url"


def part_url(part: dict) -> str:
    """The URL of an image part: `image_url` is `{"url": ..., "detail": ...}` or the URL itself.
    `detail` is accepted and ignored, as vLLM does."""
    ref = part.get("image_url")
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url:
        raise ImageError("an image_url part needs `image_url: {\"url\": \"data:image/png;base64,...\"}`")
    return url


def decode_data_url(url: str) -> bytes:
    """The bytes of a `data:image/...;base64,...` URL; anything else is an ImageError."""
    scheme = url.split(":", 1)[0].lower() if ":" in url[:16] else ""
    if scheme != "data":
        shown = f"a {scheme}: URL" if scheme else "no URL scheme"
        raise ImageError(f"only data: URLs with base64 PNG or JPEG images are accepted (the engine has no "
                         f"network access), got {shown}")
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise ImageError("malformed data: URL (no ',' before the data)")
    params = [p.strip().lower() for p in header.split(";")]
    if not params[0].startswith("image/"):
        raise ImageError(f"data: URL media type must be image/png or image/jpeg, got {params[0] or 'none'!r}")
    if params[-1] != "base64":
        raise ImageError("data: URL must be base64-encoded (`data:image/png;base64,...`)")
    try:
        return base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"data: URL is not valid base64: {e}") from None


def image_size(source: str | bytes) -> tuple[int, int]:
    """(width, height) of a PNG or JPEG, given as a data: URL or as its encoded bytes. Reads only
    the header (PNG IHDR, JPEG SOF); refuses zero sizes and sides above MAX_SIDE."""
    data = decode_data_url(source) if isinstance(source, str) else bytes(source)
    if data.startswith(_PNG_SIGNATURE):
        w, h = _png_size(data)
    elif data.startswith(b"\xff\xd8"):
        w, h = _jpeg_size(data)
    else:
        raise ImageError("image data is not a PNG or JPEG")
    if w < 1 or h < 1:
        raise ImageError(f"image has a zero size ({w}x{h})")
    if w > MAX_SIDE or h > MAX_SIDE:
        raise ImageError(f"image of {w}x{h} pixels is too large (at most {MAX_SIDE} a side)")
    return w, h


def load_image(url: str) -> Image:
    """Decode a data: URL once: its size and the hash that keys its placeholder ids."""
    data = decode_data_url(url)
    return Image(*image_size(data), hashlib.sha256(data).digest())


def chat_images(messages: list[dict], max_images: int = MAX_IMAGES) -> list[Image]:
    """Every image part of a chat request, in prompt order (the order chat_prompt places them).
    The count is checked before anything is decoded."""
    parts = [(i, j, part) for i, m in enumerate(messages) if isinstance(m.get("content"), list)
             for j, part in enumerate(m["content"]) if is_image_part(part)]
    if len(parts) > max_images:
        raise ImageError(f"at most {max_images} images per request, got {len(parts)}")
    images = []
    for i, j, part in parts:
        try:
            images.append(load_image(part_url(part)))
        except ImageError as e:
            raise ImageError(f"messages[{i}].content[{j}]: {e}") from None
    return images


def image_token_ids(digest: bytes, count: int, vocab_size: int) -> list[int]:
    """`count` prompt ids for one image: <|vision_start|>, count - 2 placeholders, <|vision_end|>.
    The placeholders are SHAKE-256 of the image's sha256, mapped into [FIRST_PLACEHOLDER, vocab):
    deterministic for the same bytes (prefix-cache hits), unrelated for different bytes."""
    if count < 2:
        raise ValueError("an image has at least its two marker tokens")
    n, span = count - 2, vocab_size - FIRST_PLACEHOLDER
    words = struct.unpack(f"<{n}I", hashlib.shake_256(digest).digest(4 * n))
    return [VISION_START, *(FIRST_PLACEHOLDER + w % span for w in words), VISION_END]


def _png_size(data: bytes) -> tuple[int, int]:
    # signature, then the IHDR chunk first: length 13, type, width, height, depth, colour type,
    # compression, filter, interlace, CRC over type + data
    if len(data) < 33:
        raise ImageError("PNG is truncated before the end of its IHDR chunk")
    length, ctype = struct.unpack(">I4s", data[8:16])
    if length != 13 or ctype != b"IHDR":
        raise ImageError("PNG does not start with a valid IHDR chunk")
    w, h, depth, colour, compression, filt, interlace, crc = struct.unpack(">IIBBBBBI", data[16:33])
    if zlib.crc32(data[12:29]) != crc:
        raise ImageError("PNG IHDR chunk has a bad CRC")
    if depth not in _PNG_DEPTHS.get(colour, ()) or compression or filt or interlace > 1:
        raise ImageError(f"PNG IHDR has invalid fields (bit depth {depth}, colour type {colour})")
    return w, h


def _jpeg_size(data: bytes) -> tuple[int, int]:
    # walk the marker segments after SOI up to the first SOF (frame header: precision, height,
    # width); tables (DQT, DHT, DAC), APPn, COM, DRI may come before it, scans (SOS) may not
    i, n = 2, len(data)
    while i < n:
        if data[i] != 0xFF:
            raise ImageError(f"JPEG has garbage at byte {i} instead of a marker")
        while i < n and data[i] == 0xFF:   # fill bytes
            i += 1
        if i >= n:
            break
        marker, i = data[i], i + 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in (0xD9, 0xDA) or marker == 0x00:
            break                              # EOI, a scan or a stuffed byte before any frame header
        if i + 2 > n:
            break
        (length,) = struct.unpack(">H", data[i:i + 2])
        if length < 2 or i + length > n:
            raise ImageError("JPEG has a truncated or malformed segment")
        if marker in _JPEG_SOF:
            if length < 8:
                raise ImageError("JPEG SOF segment is too short")
            h, w = struct.unpack(">HH", data[i + 3:i + 7])
            return w, h
        i += length
    raise ImageError("JPEG has no SOF (frame header) marker")
