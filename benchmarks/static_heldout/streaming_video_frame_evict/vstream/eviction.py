"""Frame-level KV eviction. Each stream keeps its frames' pages in a device table and one score
per frame (the attention mass the decode puts on it, accumulated on the device); once the engine
holds more visual tokens than its budget, a stream's lowest-scored frames go, with their pages."""
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from .config import VideoStreamConfig


@dataclass
class KVView:
    num_streams: int
    num_pages: int
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    indices: torch.Tensor


class FrameEvictionPolicy:
    def __init__(self, cfg: VideoStreamConfig, graph_indices: torch.Tensor, device: torch.device):
        self.cfg = cfg
        # the decode graphs' page table, patched in place after an eviction
        self.graph_indices = graph_indices
        s, f = cfg.max_streams, cfg.max_frames
        self.frame_pages = torch.zeros(s, f, cfg.pages_per_frame, dtype=torch.int32, device=device)
        self.frame_scores: List[torch.Tensor] = []
        for _ in range(s):
            self.frame_scores.append(torch.zeros(f, dtype=torch.float32, device=device))
        self.text_pages: List[List[int]] = [[] for _ in range(s)]
        self.text_len_np = np.zeros(s, dtype=np.int64)
        self.num_frames_np = np.zeros(s, dtype=np.int64)
        self.kept_tokens_np = np.zeros(s, dtype=np.int64)
        self.stream_page_start = np.zeros(s, dtype=np.int64)
        self.flat_indices = torch.zeros(s * cfg.pages_per_stream, dtype=torch.int32, device=device)
        self.kv_indptr_gpu = torch.zeros(s + 1, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(s + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(s, dtype=torch.int32, pin_memory=True)
        self.free_ring: Optional[torch.Tensor] = None
        self.free_head = 0

    def add_frames(self, stream: int, pages: torch.Tensor, num_tokens: int) -> None:
        nf, k = int(self.num_frames_np[stream]), pages.shape[0]
        self.frame_pages[stream, nf : nf + k].copy_(pages)
        self.num_frames_np[stream] += k
        self.kept_tokens_np[stream] += num_tokens

    def add_text(self, stream: int, pages: List[int], num_tokens: int) -> None:
        self.text_pages[stream].extend(pages)
        self.text_len_np[stream] += num_tokens

    def _assert_budget(self) -> None:
        assert (self.kept_tokens_np <= 2 * self.cfg.visual_token_budget).all(), "eviction fell behind"  # ok: FC109

    def kv_view(self, streams: List[int], pad_to: int) -> KVView:
        """Frames first, then the stream's text pages; rows past ``len(streams)`` are empty padding."""
        indptr, lp = self.kv_indptr_cpu.numpy(), self.last_page_len_cpu.numpy()
        indptr[0] = 0
        parts: List[torch.Tensor] = []
        for i, s in enumerate(streams):
            nf = int(self.num_frames_np[s])
            text = torch.tensor(self.text_pages[s], dtype=torch.int32).to(self.flat_indices.device, non_blocking=True)
            parts += [self.frame_pages[s, :nf].flatten(), text]
            self.stream_page_start[s] = indptr[i]
            indptr[i + 1] = indptr[i] + nf * self.cfg.pages_per_frame + len(self.text_pages[s])
            tl = int(self.text_len_np[s])
            lp[i] = (tl - 1) % self.cfg.page_size + 1 if tl else self.cfg.page_size
        n = len(streams)
        indptr[n + 1 : pad_to + 1] = indptr[n]
        lp[n:pad_to] = 1
        num_pages = int(indptr[n])
        torch.cat(parts, out=self.flat_indices[:num_pages])
        self.kv_indptr_gpu[: pad_to + 1].copy_(self.kv_indptr_cpu[: pad_to + 1], non_blocking=True)
        return KVView(
            n, num_pages, self.kv_indptr_gpu[: pad_to + 1], self.kv_indptr_cpu[: pad_to + 1],
            self.last_page_len_cpu[:pad_to], self.flat_indices[:num_pages],
        )

    def evict(self, stream: int) -> int:
        """Drop the lowest-scored frames of ``stream`` when over budget; returns the pages freed."""
        over = int(self.kept_tokens_np.sum()) - self.cfg.visual_token_budget  # ok: FC101
        if over <= 0:
            return 0
        nf = int(self.num_frames_np[stream])
        scores = self.frame_scores[stream][:nf]
        n_drop = int((scores < self.cfg.min_frame_score).sum())  # expect: FC101
        n_drop = min(max(n_drop, -(-over // self.cfg.tokens_per_frame)), nf)
        keep = torch.topk(scores, nf - n_drop).indices.sort().values
        dropped = torch.topk(scores, n_drop, largest=False).indices
        table = self.frame_pages[stream]
        if self.free_ring is None:
            self.free_ring = torch.empty(self.cfg.num_pages, dtype=torch.int32, device=table.device)  # ok: FC107
        m = n_drop * self.cfg.pages_per_frame
        self.free_ring[self.free_head : self.free_head + m].copy_(table[dropped].flatten())
        self.free_head += m
        table[: nf - n_drop] = table[keep]
        self.frame_scores[stream] = torch.cat([scores[keep], scores.new_zeros(self.cfg.max_frames - nf + n_drop)])  # expect: FC107
        self.num_frames_np[stream] = nf - n_drop
        self.kept_tokens_np[stream] -= n_drop * self.cfg.tokens_per_frame
        # patch the decode graphs' page table so the next answer step reads the compacted frames
        start = int(self.stream_page_start[stream])
        kept = table[: nf - n_drop].flatten()
        self.graph_indices[start : start + kept.numel()].copy_(kept)  # expect: FC104
        self._assert_budget()
        return m
