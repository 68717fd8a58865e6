"""Prompts of the trace's lengths, and the request bodies that carry them.

- `ids` mode: token-id arrays (ids in [1000, 8000)) to /v1/completions: exact lengths, no tokenizer.
- `text` mode: text from a built-in word corpus, `words = (tokens - a) / b` with (a, b) measured
  on the target by `calibrate` (probes at several lengths that fit its context; the line lies on
  or above every probe, so prompts err short), then corrected while running from the
  `usage.prompt_tokens` drift of each answer. `a` holds the chat template's tokens.
- `--tokenizer tokenizer.json`: text cut at an exact token boundary (needs `tokenizers`).

Each `hash_ids` block is generated from (seed, hash id) alone, so equal blocks are
byte-identical and the trace's prefix sharing reaches the server's prefix cache (the seed is
salted per run, `RunConfig.prompt_seed`, so only sharing within the run can hit); the tail
after the blocks is seeded by the row, so distinct requests never share it. A `prompt`
column is sent verbatim. A row with `num_images` is a chat request whose user message is
its text followed by that many generated images (`replay.images`) of size `image_px`. A row's
`client_id` (its tenant) goes in the body's `user`, beside the prompt, never in it.
"""
from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable

import numpy as np

from . import plan
from .images import Images

ID_LOW, ID_HIGH = 1000, 8000
# Nouns that are one token each with a leading space in engine-stub's vocabulary and in common
# BPE vocabularies: a prompt's token count is then linear in its words, not in its characters.
_WORDS = ("time year people way day man thing life child world school state family group country problem "
          "hand part place case week company system program work government number night point home water "
          "room area fact right eye word business side kind head house service power line end member law "
          "car city name president body information back face others door war history sense nation "
          "interest death experience use field development show light mind action model tax form matter "
          "need data news").split()
_WORD_ARR = np.array(_WORDS)


def _ids(seed: int, key: int, n: int) -> list[int]:
    """n deterministic token ids from (seed, key) alone. SHAKE-128 as the stream: ~5 us per
    request, where seeding a numpy Generator per request cost ~25 us. (Text keeps numpy's
    stream.)"""
    raw = hashlib.shake_128(struct.pack("<IQ", seed & 0xFFFFFFFF, key & 0xFFFFFFFFFFFFFFFF)).digest(4 * n)
    if n < 64:   # NumPy's per-call overhead outweighs a short list
        return [x % (ID_HIGH - ID_LOW) + ID_LOW for x in struct.unpack(f"<{n}I", raw)]
    return (np.frombuffer(raw, "<u4") % (ID_HIGH - ID_LOW) + ID_LOW).tolist()


def corpus_text(seed: int, key: int, words: int) -> str:
    """Deterministic text of `words` words, each with a leading space. The words come in shuffled
    passes over the whole corpus: should a tokenizer split a few of them, every text of n words
    still holds them about n / len(_WORDS) times, so its token count stays linear in n."""
    if words <= 0:
        return ""
    rng = np.random.default_rng([seed & 0xFFFFFFFF, key & 0xFFFFFFFFFFFFFFFF])
    passes = np.tile(np.arange(len(_WORDS)), (-(-words // len(_WORDS)), 1))
    return " " + " ".join(_WORD_ARR[rng.permuted(passes, axis=1).ravel()[:words]])


class PromptBuilder:
    """Builds request bodies for rows; one per runner process."""

    def __init__(self, config: plan.RunConfig) -> None:
        self.c = config
        self.mode, self.seed, self.bs = config.prompt_mode, config.prompt_seed, config.block_size
        self.blocks: dict[int, object] = {}
        self.cal = dict(config.calibration or {})
        self.drift: dict[str, float] = {}
        # a continuation turn's history holds replies the server re-tokenizes from text: the most
        # it counted over the turn's aim so far, left free in later turns (engine-stub: up to 3)
        self.extra: dict[str, int] = {}
        self.tok = load_tokenizer(config.tokenizer) if config.tokenizer else None
        self.images = Images(config.prompt_seed, config.image_url_base)

    # --- token ids ----------------------------------------------------------------
    def _block(self, h: int, text_words: int = 0):
        blk = self.blocks.get((h, text_words))
        if blk is None:
            if len(self.blocks) > 8192:  # bounded cache; regenerating is deterministic
                self.blocks.clear()
            blk = self.blocks[h, text_words] = corpus_text(self.seed, h, text_words) if text_words \
                else _ids(self.seed, h, self.bs)
        return blk

    def ids(self, row: tuple) -> list[int]:
        n = max(1, row[plan.IN])
        out: list[int] = []
        for h in (row[plan.HASH] or ())[:-(-n // self.bs)]:   # the blocks that start before token n
            out += self._block(h)
        if len(out) < n:
            out += _ids(self.seed ^ 0x5EED, row[plan.IDX] + 1, n - len(out))
        return out[:n]

    # --- text ---------------------------------------------------------------------
    def cal_key(self, api: str, target: str | None = None) -> str:
        """Calibration and drift are per API and per target (deployments of other models tokenize
        differently): `api` for the run's default target, `api@URL` for another."""
        return api if target is None or target == self.c.target else f"{api}@{target}"

    def text(self, row: tuple, api: str, tokens: int | None = None, target: str | None = None) -> str:
        n = max(1, row[plan.IN] if tokens is None else tokens)
        key = self.cal_key(api, target)
        if self.tok is not None:   # a row's input_tokens count the chat template the server adds
            return self._exact_text(row, max(1, n - self.c.template_tokens.get(key, 0)))
        a, b = self.cal.get(key, (0.0, 1.0))[:2]
        block_words = max(1, round(self.bs / b))  # fixed for the run: identical blocks stay identical
        # floor: the server's count stays at or under n (the template's tokens are in a)
        want = max(1, int((n - a) / (b * max(1.0, self.drift.get(key, 1.0))) + 1e-6))
        hashes = (row[plan.HASH] or ())[:want // block_words]   # the whole blocks that fit
        return "".join([*(self._block(h, block_words) for h in hashes),
                        corpus_text(self.seed ^ 0x5EED, row[plan.IDX] + 1, want - len(hashes) * block_words)])

    def observe(self, api: str, sized: tuple[int, int], prompt_tokens: int | None, target: str | None = None) -> None:
        """Corrections from `usage.prompt_tokens` of a prompt `body` built, `sized` (words, aim):
        the calibration's drift from whole prompts of `words` words (text mode without a
        tokenizer), the continuations' margin from the tokens a continuation aimed at. Both only
        ever shorten: a longer prompt than asked can exceed the context."""
        words, aim = sized
        key = self.cal_key(api, target)
        if aim and prompt_tokens:
            self.extra[key] = max(self.extra.get(key, CONTINUATION_MARGIN), prompt_tokens - aim)
        if self.mode != "text" or self.tok is not None or not prompt_tokens or words <= 0:
            return
        a, b = self.cal.get(key, (0.0, 1.0))[:2]
        f = min(2.0, max(0.5, (prompt_tokens - a) / (b * words)))
        self.drift[key] = 0.8 * self.drift.get(key, 1.0) + 0.2 * f

    def _exact_text(self, row: tuple, n: int) -> str:
        """The row's blocks then its own tail, cut at the end of token n (special tokens are
        not counted, as in the importer). A word is at least one token; a tokenizer that merges
        words gets a longer tail, never a short prompt."""
        blocks = "".join(self._block(h, self.bs) for h in (row[plan.HASH] or ()))
        words = n + 16
        for _ in range(4):
            text = blocks + corpus_text(self.seed ^ 0x5EED, row[plan.IDX] + 1, words)
            offsets = self.tok.encode(text, add_special_tokens=False).offsets
            if len(offsets) >= n:
                return text[:offsets[n - 1][1]]
            words *= 4
        raise PromptError(f"the tokenizer makes only {len(offsets)} tokens of {len(text)} characters; needs {n}")

    # --- bodies -------------------------------------------------------------------
    def body(self, row: tuple, model: str | None, api: str, history: list[dict] | None = None,
             user_tokens: int | None = None, target: str | None = None) -> tuple[str, bytes, tuple, str | None]:
        """(path, JSON body, sized, user text) for one row sent to `target`; sized, for `observe`:
        (words of a built whole prompt, else 0; the tokens a built continuation aimed at, else 0)."""
        text, sized = row[plan.PROMPT], (0, 0)
        if text is None and (api == "chat" or self.mode == "text"):
            if history and user_tokens is not None and user_tokens < row[plan.IN]:  # history + turn = input_tokens
                margin = self.extra.get(self.cal_key(api, target), CONTINUATION_MARGIN)
                text = self.text(row, api, user_tokens - margin, target)
                sized = (0, row[plan.IN] - margin)
            else:
                text = self.text(row, api, user_tokens, target)
                sized = (0, 0) if history else (text.count(" "), 0)
        req: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
        images = row[plan.IMAGES]
        if api == "chat":
            path = "/v1/chat/completions"
            content = [{"type": "text", "text": text}, _IMAGES] if images else text
            req["messages"] = [*(history or ()), {"role": "user", "content": content}]
        else:
            path = "/v1/completions"
            req["prompt"] = text if text is not None else self.ids(row)
        out = row[plan.OUT]
        if out is not None:
            req["max_tokens"] = max(1, out)
            if self.c.force_output_len:
                req.update(min_tokens=max(1, out), ignore_eos=True)
        if row[plan.REASON] is not None and api == "chat" and self.c.ask_reasoning:
            req["reasoning_tokens"] = row[plan.REASON]   # engine-stub's field; real servers decide themselves
        if row[plan.CLIENT] is not None:   # the tenant, OpenAI's field (vLLM, SGLang take it): the prompt is unchanged
            req["user"] = row[plan.CLIENT]
        body = json.dumps(req, separators=(",", ":")).encode()
        if images and api == "chat":    # spliced in as bytes: one copy of the images' base64
            head, tail = body.split(_IMAGES_JSON, 1)
            body = b"".join([head, *self.images.parts(images, row[plan.IMAGE_PX], row[plan.IDX]), tail])
        return path, body, sized, text


CONTINUATION_MARGIN = 4   # tokens a continuation leaves free before any was measured
_IMAGES = "@@llm-replay-images@@"          # where the image parts go in the JSON body
_IMAGES_JSON = json.dumps(_IMAGES).encode()


def load_tokenizer(path: str):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise PromptError("--tokenizer needs the `tokenizers` package (pip install tokenizers)") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - any load failure is a bad input file
        raise PromptError(f"{path}: cannot load tokenizer.json: {e}") from None


class PromptError(ValueError):
    exit_code = 2


def template_tokens(post: Callable[[str, dict], dict], model: str, tok, seed: int = 0) -> int:
    """Tokens the target's chat template adds around a user message (usage.prompt_tokens of a
    message of exactly 32 tokens by `tok`, less 32): --tokenizer cuts chat text that much shorter."""
    text = corpus_text(seed, 0x7E3, 400)
    offsets = tok.encode(text, add_special_tokens=False).offsets
    text = text[:offsets[min(32, len(offsets)) - 1][1]]
    n = len(tok.encode(text, add_special_tokens=False).ids)
    msg = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    pt = (post("/v1/chat/completions", msg).get("usage") or {}).get("prompt_tokens")
    if not isinstance(pt, int):
        raise PromptError("--tokenizer with chat: no usage.prompt_tokens from the target to measure its chat template")
    return max(0, pt - n)


def calibrate(post: Callable[[str, dict], dict], api: str, model: str, seed: int = 0,
              context: int | None = None) -> tuple[float, float, list[list[int]]]:
    """Measure tokens = a + b * words for the built-in corpus: probes of 8, 32, 128, ... 2048 words,
    each sent only where its predicted tokens (+1 to generate) fit `context` (the model's
    max_model_len; a probe the server refuses ends them once two are in). b is the least-squares
    slope, a the smallest intercept that puts every probe on or under the line, so built prompts
    err short. `post(path, json_body) -> response JSON` is a blocking HTTP call. Returns (a, b,
    [[words, prompt_tokens], ...])."""
    points: list[list[int]] = []
    words = 8
    while words <= 2048:
        if points and context:   # the next probe's tokens, as the probes so far say, with room to spare
            (w0, p0), (w1, p1) = points[0], points[-1]
            per = (p1 - p0) / (w1 - w0) if w1 > w0 else p1 / w1
            if p1 + 1.25 * per * (words - w1) + 1 > context:
                break
        text = corpus_text(seed, 0xCA11B + words, words)
        path, body = ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}) if api == "chat" \
            else ("/v1/completions", {"prompt": text})
        try:
            resp = post(path, {"model": model, **body, "max_tokens": 1})
        except Exception:   # noqa: BLE001 - a context we were not told: the probes so far serve
            if len(points) < 2:
                raise
            break
        pt = (resp.get("usage") or {}).get("prompt_tokens")
        if not pt:
            raise PromptError(f"calibration: the target reported no usage.prompt_tokens for {api}")
        points.append([words, pt])
        words *= 4
    if len(points) < 2:
        raise PromptError(f"calibration: the target's context ({context} tokens) holds no {api} probe of 32 words")
    w, p = np.array(points, dtype=float).T
    b = max(1e-3, float(np.polyfit(w, p, 1)[0]))
    return float(max(p - b * w)), b, points
