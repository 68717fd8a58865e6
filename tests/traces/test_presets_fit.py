"""Every preset fits the default engine-stub: each generated row's prompt + output (+ its
image tokens, counted as the engine counts them) is within the engine's default context."""
from __future__ import annotations

import numpy as np
import pytest

from llm_replay.traces.generate import generate
from llm_replay.traces.presets import PRESETS, preset_spec

CHAT_SLACK = 64   # image rows go as chat: the template's tokens and the text calibration's drift


def _default_context() -> int:
    from llm_replay.engine_stub.config import PRESETS as MODELS, EngineConfig
    cfg = EngineConfig()
    return min(cfg.max_model_len, EngineConfig.DEFAULT_NUM_BLOCKS * cfg.block_size, MODELS["tiny"].max_position)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_row_fits_the_default_engine_context(name):
    from llm_replay.engine_stub.images import image_tokens
    limit = _default_context()
    tb = generate(preset_spec(name), seed=1).table
    inp = tb.column("input_tokens").to_numpy().astype(np.int64)
    out = np.nan_to_num(tb.column("output_tokens").to_numpy(zero_copy_only=False)).astype(np.int64)
    img = np.zeros(len(inp), np.int64)
    if "num_images" in tb.column_names:
        counts = np.nan_to_num(tb.column("num_images").to_numpy(zero_copy_only=False)).astype(np.int64)
        px = tb.column("image_px").to_pylist() if "image_px" in tb.column_names else [None] * len(inp)
        img = np.array([k * image_tokens(*map(int, (p or "512x512").split("x"))) if k else 0
                        for k, p in zip(counts, px)], np.int64)
    total = inp + out + img + np.where(img > 0, CHAT_SLACK, 0)
    worst = int(np.argmax(total))
    assert total[worst] <= limit, (f"{name}: row {worst} needs {total[worst]} tokens (input {inp[worst]}, "
                                   f"output {out[worst]}, images {img[worst]}) > the default context {limit}")
    if name == "vision":
        assert img.max() > 0 and (counts >= 4).any()   # still images, and document batches
