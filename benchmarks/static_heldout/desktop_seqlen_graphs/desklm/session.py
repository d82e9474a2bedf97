"""A chat session: load a prompt, then produce one token per call."""
from __future__ import annotations

import logging
import queue
from typing import Iterator, List, Optional

import torch

from desklm import _desk_kernels  # the engine's compiled helpers (fused embedding lookup, token streaming)
from desklm.buckets import LengthBuckets
from desklm.kv.paged_cache import SingleSeqKVCache
from desklm.model import DeskModel
from desklm.sampler import Sampler
from desklm.settings import DeskSettings

logger = logging.getLogger(__name__)


class DesktopSession:
    def __init__(self, s: DeskSettings, device: torch.device):
        self.s = s
        self.device = device
        self.kv = SingleSeqKVCache(s, device)
        self.buckets = LengthBuckets(s.bucket_lengths, s, self.kv, device)
        self.model = DeskModel(s, self.buckets, self.kv).to(device).half()
        self.sampler = Sampler(s.vocab_size, device)
        self.static_id = torch.zeros(1, dtype=torch.int64, device=device)
        self.static_pos = torch.zeros(1, dtype=torch.int64, device=device)
        self.stream_out: "queue.Queue[int]" = queue.Queue()
        self.last_logits: Optional[torch.Tensor] = None
        self._fixed_batch_size = 1  # ok: FC103
        self._graphs_ready = False

    # ---- set-up -------------------------------------------------------------------------------
    def _static_forward(self) -> torch.Tensor:
        return self.model(self.static_id, self.static_pos, False)

    def capture_buckets(self) -> None:
        self.buckets.init_buffers()
        for L in self.buckets.lengths:
            self.buckets.record(L, self._static_forward)
        self._graphs_ready = True

    def load_prompt(self, token_ids: List[int]) -> None:
        assert 0 < len(token_ids) < self.s.max_context, "prompt does not fit the context"  # expect: FC109
        self.kv.reset()
        ids = torch.tensor(token_ids, dtype=torch.int64).to(self.device, non_blocking=True)
        pos = torch.arange(len(token_ids), device=self.device)
        n = len(token_ids)
        self.buckets.kv_indptr_host[1] = self.kv.num_pages(n)
        self.buckets.last_page_host[0] = (n - 1) % self.s.page_size + 1
        logits = self.model(ids, pos, True)
        self.kv.advance(n)
        self.static_id.copy_(self.sampler.sample(logits))

    # ---- the per-token path (configured hot path) -----------------------------------------------
    def next_token(self) -> int:
        seq_len = self.kv.seq_len
        if int(self.kv.seq_len_gpu) >= self.s.max_context:  # expect: FC101
            raise RuntimeError(f"context full at {self.kv.seq_len_gpu}")  # ok: FC101
        kv_len = self.kv.kv_len_cpu[0].item()  # ok: FC101
        self.static_pos.fill_(kv_len)
        bucket = self.buckets.bucket_for(seq_len + 1)
        if bucket is not None and self._graphs_ready:
            self.buckets.prepare_bucket(bucket, seq_len + 1)
            self.buckets.graphs[bucket].replay()
            logits = self.buckets.graph_out[bucket]
        else:
            self.buckets.plan_beyond_buckets(seq_len + 1)
            logits = self.model(self.static_id, self.static_pos, False)
        self.last_logits = logits.clone()  # expect: FC107
        next_id = self.sampler.sample(logits)
        self.sampler.observe(next_id)
        self.static_id.copy_(next_id)
        self.kv.advance(1)
        self.buckets.last_page_len.add_(1)  # expect: FC104
        tok = next_id.item()  # expect: FC101
        self.stream_out.put(tok)
        return tok

    def stream(self, max_new_tokens: int) -> Iterator[int]:
        for _ in range(max_new_tokens):
            yield self.next_token()

    def regenerate_last(self) -> int:
        if self.last_logits is None:
            raise RuntimeError("nothing to regenerate")
        return int(_desk_kernels.argmax_host(self.last_logits))

    def describe(self) -> dict:
        """What the settings page of the desktop app shows."""
        return {
            "sampler": self.sampler._backend,  # ok: FC103
            "buckets": list(self.buckets.lengths),
            "captured": sorted(self.buckets.graphs),
            "context": self.kv.seq_len,
            "max_context": self.s.max_context,
            "local_window": self.s.local_window,
        }

    def save_transcript(self, path: str, token_ids: List[int]) -> None:
        with open(path, "w") as fh:
            fh.write(" ".join(str(t) for t in token_ids))
