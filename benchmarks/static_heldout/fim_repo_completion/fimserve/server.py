import logging
from dataclasses import dataclass
from typing import List

import torch

import flashcheck
from fimserve.graphs import CompletionGraphs
from fimserve.kernels.attention import FimAttention
from fimserve.limits import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, ServeLimits
from fimserve.model import CodeModel
from fimserve.repo_cache import RepoContextCache

logger = logging.getLogger(__name__)


@dataclass
class TickBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_len_cpu: torch.Tensor
    suffix_ids_cpu: torch.Tensor
    num_pages: int


def _scrub_rows(buf, rows):
    buf[rows] = 1


class CompletionServer:
    def __init__(self, limits: ServeLimits, device="cuda"):
        self.limits = limits
        self.device = device
        self.repo_cache = RepoContextCache(limits.max_pages // 4)
        self.attn = FimAttention(limits, self.repo_cache, device)
        self.attn.init_buffers()
        self.model = CodeModel(limits, self.attn).to(device)
        self.kv_caches = [torch.zeros(limits.max_pages, 2, limits.page_size, limits.num_kv_heads, limits.head_dim,
                                      dtype=torch.bfloat16, device=device) for _ in range(32)]
        self.repo_kvs = [kv for kv in self.kv_caches]
        self.graphs = CompletionGraphs(limits, self.model, self.attn, self.kv_caches, self.repo_kvs, device)
        self.stop_flags = None
        self.lens_host = None
        self.pending = []
        self.ticks = 0

    def submit(self, prefix_ids: List[int], suffix_ids: List[int], repo_id: str):
        assert len(prefix_ids) + len(suffix_ids) <= self.limits.max_prompt  # expect: FC109
        prompt = [FIM_PREFIX] + prefix_ids + [FIM_SUFFIX] + suffix_ids + [FIM_MIDDLE]
        self.pending.append((prompt, suffix_ids, self.repo_cache.lookup(repo_id)))

    def cancel(self, slots: List[int]):
        _scrub_rows(self.attn.kv_last_page_len, slots)  # expect: FC104

    @flashcheck.hot_path
    def tick(self, batch: TickBatch, cancelled: List[int]):
        bs = batch.input_ids.shape[0]
        self.ticks += 1
        logger.info(f"tick {self.ticks} bs={bs}")  # ok: FC101
        if self.stop_flags is None:
            self.stop_flags = torch.zeros(self.limits.max_batch, dtype=torch.bool, device=self.device)  # ok: FC107
        self.lens_host = torch.tensor([int(n) for n in batch.last_len_cpu], dtype=torch.int32)  # ok: FC107
        if cancelled:
            self.cancel(cancelled)
        self.graphs.static_positions = batch.positions.clone()  # expect: FC107
        logits = self.graphs.replay(bs, batch)
        tokens = logits.argmax(-1)
        tokens = torch.where(self.stop_flags[:bs], torch.full_like(tokens, 0), tokens)  # ok: FC101
        suffix = batch.suffix_ids_cpu.tolist()  # ok: FC101
        done = torch.nonzero(self.stop_flags[:bs])  # expect: FC101
        return tokens, done, suffix
