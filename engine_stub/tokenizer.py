"""A deterministic offline tokenizer: special tokens, 256 byte tokens, common English words
and frequent letter n-grams (~4 chars/token on English), plus an incremental UTF-8-safe
detokenizer and a ChatML-style chat template. No files, no hub: the vocab is built in code.
"""
from __future__ import annotations

import codecs
import itertools
import re
from collections import Counter
from functools import lru_cache
from typing import Sequence

from .images import is_image_part

SPECIALS = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<unused7>"]
PAD, BOS, EOS, IM_START, IM_END, VISION_START, VISION_END = range(7)
BYTE_OFFSET = len(SPECIALS)

_WORDS = """the of and to in is that for it as was with be by on not he this are or his from at which
but have an they you were her she there one all we their can has been if more when will would who so
no what up out about into than them only other time new some could these two may first then do any like
my now over such our man me even most made after also did many before must through back years where much
your way well down should because each just those people how too little state good very make world still
own see men work long get here between both life being under never day same another know while last might
us great old year off come since against go came right used take three states himself few house use during
without again place around however home small found mrs thought went say part once general high upon school
every don does got united left number course war until always away something fact though water less public
put think almost hand enough far took head yet government system better set told nothing night end why
called didn eyes find going look asked later knew point next program city business give group toward young
days let room president side social given present several order national possible rather second face per
among form important often things looked early white case john become large big need four within felt
along children saw best church ever least power development light thing seemed family interest want members
mind country area others done turned although open god service certain kind problem began different door
thus help sense means whole matter perhaps itself york times law human line above name example action
company hands local show whether five history gave today either act feet across taken past quite anything
having seen death experience body word half really week free car field already information tell together
model request token server latency replay trace data""".split()
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
_PRETOKEN = re.compile(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+")
_MAX_PIECE = 16


class Tokenizer:
    """Greedy longest-match tokenizer over a fixed, code-generated vocabulary."""

    def __init__(self, vocab_size: int = 8192) -> None:
        pieces: list[bytes] = [b""] * len(SPECIALS) + [bytes([b]) for b in range(256)]
        seen = set(pieces)

        def add(s: str) -> None:
            b = s.encode()
            if len(pieces) < vocab_size and b not in seen:
                seen.add(b)
                pieces.append(b)

        for w in _WORDS:
            add(" " + w), add(w), add(" " + w.capitalize()), add(w.capitalize()), add(" " + w + "s")
        for w in _WORDS:
            add(" " + w + "ing"), add(" " + w + "ed"), add(w + "s"), add(w + "ing"), add(w + "ed")
        for combo in itertools.product(_LETTERS, repeat=2):
            add(" " + "".join(combo)), add("".join(combo))
        # word fragments (prefixes, suffixes, stems) by how often they occur in the word list
        grams = Counter(g for w in _WORDS for n in range(3, 7) for k in range(len(w) - n + 1)
                        for g in ((" " + w[:n],) if k == 0 else ()) + (w[k:k + n],))
        for g, _ in sorted(grams.items(), key=lambda kv: (-kv[1] * len(kv[0]), kv[0])):
            add(g)
        for combo in itertools.product(_LETTERS, repeat=3):
            add(" " + "".join(combo)), add("".join(combo))
        while len(pieces) < vocab_size:  # only reached for vocabularies far above 8192
            pieces.append(f"<extra{len(pieces)}>".encode())
        self.vocab_size, self.pieces = vocab_size, pieces
        self._lookup = {p.decode("latin-1" if len(p) == 1 else "utf-8"): i
                        for i, p in enumerate(pieces) if p and (len(p) > 1 or p[0] < 128)}
        self._lookup.update({chr(b): BYTE_OFFSET + b for b in range(128)})
        self.encode_word = lru_cache(maxsize=1 << 16)(self._encode_word)

    def encode(self, text: str) -> list[int]:
        return list(itertools.chain.from_iterable(map(self.encode_word, _PRETOKEN.findall(text))))

    def _encode_word(self, word: str) -> tuple[int, ...]:
        out, i, n = [], 0, len(word)
        while i < n:
            for j in range(min(n, i + _MAX_PIECE), i, -1):
                tid = self._lookup.get(word[i:j])
                if tid is not None:
                    out.append(tid)
                    i = j
                    break
            else:  # a non-ASCII character: its UTF-8 bytes
                out.extend(BYTE_OFFSET + b for b in word[i].encode())
                i += 1
        return tuple(out)

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")

    def chat_prompt(self, messages: list[dict], images: Sequence[Sequence[int]] = ()) -> list[int]:
        """ChatML: <|im_start|>role\\ncontent<|im_end|>\\n ... <|im_start|>assistant\\n

        `images` are the token ids of the image parts in order of appearance (images.chat_images):
        each goes in at its part's place, the text around it encoded on either side of it."""
        ids: list[int] = []
        pending = iter(images)
        for m in messages:
            ids.append(IM_START)
            content, text = m.get("content"), f"{m['role']}\n"
            for part in content if isinstance(content, list) else [{"text": content or ""}]:
                if images and is_image_part(part):
                    ids += [*self.encode(text), *next(pending)]
                    text = ""
                elif isinstance(part, dict):
                    text += part.get("text", "")
            ids += [*self.encode(text), IM_END, *self.encode("\n")]
        return [*ids, IM_START, *self.encode("assistant\n")]

    def generation_banned_ids(self) -> list[int]:
        """Tokens the sampler never emits: specials other than EOS, control bytes and bytes that
        are not valid UTF-8 on their own, so every generated token adds visible text."""
        return ([i for i in range(len(SPECIALS)) if i != EOS]
                + [BYTE_OFFSET + b for b in range(256) if (b < 32 and b not in (9, 10)) or b >= 127])


class IncrementalDetokenizer:
    """Turns token ids into text deltas without ever splitting a UTF-8 sequence."""

    __slots__ = ("_pieces", "_decoder")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._pieces = tokenizer.pieces
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, ids: list[int]) -> str:
        return self._decoder.decode(b"".join(self._pieces[i] for i in ids))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
