"""Host bookkeeping of every row's output tokens, in numpy."""

from __future__ import annotations

import numpy as np
from flashcheck import hot_path


class TokenHistory:
    def __init__(self, max_rows: int, max_tokens: int):
        self.max_rows = max_rows
        self.tokens_np = np.zeros((max_rows, max_tokens), dtype=np.int64)
        self.len_np = np.zeros(max_rows, dtype=np.int64)
        self.limit_np = np.zeros(max_rows, dtype=np.int64)

    def add_request(self, row: int, max_tokens: int) -> None:
        assert 0 <= row < self.max_rows, "row out of range"  # expect: FC109
        self.len_np[row] = 0
        self.limit_np[row] = max_tokens

    @hot_path
    def record_step(self, rows: np.ndarray, tokens_np: np.ndarray) -> np.ndarray:
        pos = self.len_np[rows]
        self.tokens_np[rows, pos] = tokens_np
        self.len_np[rows] += 1
        return rows[self.len_np[rows] >= self.limit_np[rows]]  # ok: FC101

    def last_token(self, row: int) -> int:
        return int(self.tokens_np[row, self.len_np[row] - 1])
