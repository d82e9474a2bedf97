"""One CUDA graph per (batch bucket, block length): the model forward of one denoising step."""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

import torch

from dllm.attn import BidirBlockAttention, GraphKey
from dllm.config import DLLMConfig
from dllm.model import DiffusionLM


class BlockGraphRunner:
    def __init__(self, cfg: DLLMConfig, model: DiffusionLM, attn: BidirBlockAttention, device: torch.device,
                 use_cuda_graph: bool = True):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.device = device
        self.buckets = sorted(cfg.graph_bs)
        self.keys: List[GraphKey] = [(bs, n) for bs in self.buckets for n in cfg.block_lens]
        self.static_tokens = {
            key: torch.full(key, cfg.mask_id, dtype=torch.int64, device=device) for key in self.keys
        }
        self.static_pos = {key: torch.zeros(key, dtype=torch.int64, device=device) for key in self.keys}
        self.logits: Dict[GraphKey, torch.Tensor] = {}
        self.graphs: Dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self._use_cuda_graph = use_cuda_graph  # ok: FC103

    def key_for(self, bs: int, block_len: int) -> Optional[GraphKey]:
        i = bisect.bisect_left(self.buckets, bs)
        if not self._use_cuda_graph or i == len(self.buckets):
            return None
        return self.buckets[i], block_len

    def record(self) -> None:
        if not self._use_cuda_graph:
            return
        torch.cuda.synchronize()  # ok: FC101
        for key in sorted(self.keys, reverse=True):
            w = self.attn.graph_wrappers[key]
            if not w._use_cuda_graph:  # expect: FC103
                raise RuntimeError(f"prefix wrapper {key} was built without use_cuda_graph")
            self.attn.bind_dummy(key)
            tokens, pos = self.static_tokens[key].view(-1), self.static_pos[key].view(-1)
            for _ in range(2):
                self.model(tokens, pos, key)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.logits[key] = self.model(tokens, pos, key)
            self.pool = graph.pool()
            self.graphs[key] = graph

    def prepare_step_inputs(self, req_ids: List[int], tokens: torch.Tensor, positions: torch.Tensor, key: GraphKey) -> None:
        bs, block_len = key
        n = len(req_ids)
        H, KVH, D, P = self.attn._dims()
        a = self.attn
        self.static_tokens[key] = tokens.clone()  # expect: FC107
        self.static_pos[key][:n].copy_(positions)
        kv_indptr, kv_indices, last = a.cache.page_table(req_ids)
        total, pad = int(kv_indptr[-1]), bs - n
        # the graph always runs bs * block_len queries: padded rows get a one-page prefix (page 0)
        a.qo_indptr_host[: bs + 1] = torch.arange(0, (bs + 1) * block_len, block_len, dtype=torch.int32)
        a.kv_indptr_host[: n + 1].copy_(kv_indptr)
        a.kv_indptr_host[n + 1 : bs + 1] = torch.arange(total + 1, total + pad + 1, dtype=torch.int32)
        a.last_page_len_host[:n].copy_(last)
        a.last_page_len_host[n:bs] = 1
        indices = torch.cat([kv_indices, torch.zeros(pad, dtype=torch.int32, device=self.device)])
        a.g_kv_indices[: total + pad].copy_(indices)  # ok: FC104
        a.graph_wrappers[key].plan(  # ok: FC102
            a.qo_indptr_host[: bs + 1], a.kv_indptr_host[: bs + 1], indices, a.last_page_len_host[:bs],
            H, KVH, D, P, causal=False, q_data_type=self.cfg.dtype,
        )
        a.plan_block_self(bs, block_len)
        # padded rows need no attention at all: make their query ranges empty
        a.g_qo_indptr[n + 1 : bs + 1] = n * block_len  # expect: FC104

    def replay(self, req_ids: List[int], tokens: torch.Tensor, positions: torch.Tensor, key: GraphKey) -> torch.Tensor:
        self.prepare_step_inputs(req_ids, tokens, positions, key)
        self.graphs[key].replay()
        n, block_len = len(req_ids), key[1]
        return self.logits[key][: n * block_len]
