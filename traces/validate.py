"""Rules beyond the column types that `conform` checks: prefix blocks vs prompt length."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import TraceError


def check_blocks(hash_ids: pa.Array | pa.ChunkedArray, input_tokens: pa.Array | pa.ChunkedArray, block_size: int,
                 *, file: str | None, row0: int = 0) -> None:
    """A request cannot hold more prefix blocks than ceil(input_tokens / block_size)."""
    n = pc.list_value_length(hash_ids).fill_null(0).to_numpy(zero_copy_only=False)
    cap = -(-np.asarray(input_tokens.to_numpy(zero_copy_only=False), dtype=np.float64) // block_size)
    bad = n > cap
    if bad.any():
        raise TraceError(f"hash_ids has more blocks than ceil(input_tokens / {block_size}) allows",
                         file=file, column="hash_ids", rows=(np.flatnonzero(bad)[:11] + row0).tolist(),
                         total_rows=len(n) if row0 == 0 else None)
