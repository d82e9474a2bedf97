"""Prompt lookup decoding: draft tokens copied from an earlier n-gram match in the request's own history."""
import numpy as np


class PromptLookup:
    def __init__(self, max_ngram: int, num_pred: int, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_pred = num_pred

    def propose(self, history_np: np.ndarray) -> list[int]:
        n_hist = history_np.shape[0]
        for n in range(min(self.max_ngram, n_hist - 1), self.min_ngram - 1, -1):
            tail = history_np[n_hist - n :]
            windows = np.lib.stride_tricks.sliding_window_view(history_np[:-1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if hits.size == 0:
                continue
            start = int(hits[-1]) + n
            cand = history_np[start : start + self.num_pred]
            if cand.size:
                return cand.tolist()  # ok: FC101
        return []
