"""Builds the streamed chunks: text deltas and, when asked for, the top-n logprobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Protocol

import numpy as np
import torch

from .history import TokenHistory
from .params import SamplingParams


class Detokenizer(Protocol):
    def decode_incremental(self, rid: int, token: int) -> str: ...


@dataclass
class SamplerOutput:
    tokens: torch.Tensor
    logprobs: torch.Tensor
    topn_ids: torch.Tensor
    topn_logprobs: torch.Tensor


@dataclass
class StreamState:
    rid: int
    params: SamplingParams


class StreamingResponseBuilder:
    def __init__(self, history: TokenHistory, detok: Detokenizer):
        self.history = history
        self.detok = detok
        self.streams: Dict[int, StreamState] = {}

    def open(self, row: int, rid: int, params: SamplingParams) -> None:
        self.streams[row] = StreamState(rid, params)

    def emit(self, rows: np.ndarray, packed_np: np.ndarray, out: SamplerOutput) -> List[dict]:
        """packed_np: [n, 1 + max_top_n] host copy of the sampled token and the top-n ids."""
        chunks = []
        for i, row in enumerate(rows.tolist()):
            st = self.streams[row]
            chunk = {"id": st.rid, "index": int(self.history.len_np[row]) - 1}
            chunk["text"] = self.detok.decode_incremental(st.rid, int(packed_np[i, 0]))
            k = st.params.top_n_logprobs
            if k:
                ids = packed_np[i, 1 : 1 + k].tolist()
                lps = out.topn_logprobs[i, :k].tolist()  # expect: FC101
                chunk["top_logprobs"] = [{"token": t, "logprob": lp} for t, lp in zip(ids, lps)]
            chunks.append(chunk)
        return chunks
