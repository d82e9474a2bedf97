"""Constrained decode graphs: decode (or draft verify), bitmask and argmax in one graph."""
from __future__ import annotations

import bisect
from typing import Dict, Tuple

import torch

from tokheal.config import HealConfig
from tokheal.mask.kernels import apply_token_bitmask_inplace
from tokheal.mask.vocab_mask import VocabMaskBuilder
from tokheal_srv.attention import HealAttention
from tokheal_srv.model import HealLM
from tokheal_srv.pages import PageLayout


class ConstrainedDecodeGraphs:
    def __init__(self, model: HealLM, attn: HealAttention, masker: VocabMaskBuilder, cfg: HealConfig, device) -> None:
        self.model = model
        self.attn = attn
        self.masker = masker
        self.k = cfg.spec_k
        self.buckets = sorted(cfg.graph_buckets)
        max_bs = self.buckets[-1]
        self.words = masker.words
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_draft = torch.zeros((max_bs, cfg.spec_k + 1), dtype=torch.int64, device=device)
        self.static_mask = torch.full((max_bs, self.words), -1, dtype=torch.int32, device=device)
        self.graphs: Dict[Tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Tuple[int, bool], torch.Tensor] = {}
        self.mem_pool = None

    def bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def record_all(self) -> None:
        self.attn.init_decode_graph_buffers()
        self.mem_pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            self.record(bs, spec=False)
            self.record(bs, spec=True)

    def record(self, bs: int, spec: bool) -> None:
        w = self.attn.graph_decode[bs]
        if not w.is_cuda_graph_enabled:  # ok: FC103
            raise RuntimeError(f"bucket {bs}: decode wrapper is not in graph mode")
        if vars(w).get("_fixed_batch_size") != bs:  # expect: FC103
            raise RuntimeError(f"bucket {bs}: wrapper was built for another batch size")
        if int(self.static_mask[:bs].sum()) != -bs * self.words:  # expect: FC101
            self.static_mask[:bs].fill_(-1)
        layout = PageLayout.dummy(bs)
        self.attn.stage_decode(bs, bs, layout, self.static_positions[:bs])
        if spec:
            self.attn.plan_verify(bs, self.k, layout)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mem_pool):
            if spec:
                logits = self.model.verify_tokens(self.static_draft[:bs])[:, -1]
            else:
                logits = self.model.decode_tokens(self.static_ids[:bs])
            apply_token_bitmask_inplace(logits, self.static_mask[:bs])
            out = logits.argmax(-1)
        self.graphs[(bs, spec)] = graph
        self.outputs[(bs, spec)] = out
        self.attn.graph_bs = None

    def launch(self, bs: int, n: int, spec: bool, ids: torch.Tensor, positions: torch.Tensor, layout: PageLayout) -> torch.Tensor:
        if spec:
            self.static_draft[:n].copy_(ids)
        else:
            self.static_ids[:n].copy_(ids)
        self.static_positions[:n].copy_(positions)
        self.attn.stage_decode(bs, n, layout, self.static_positions[:bs])
        if spec:
            self.attn.plan_verify(n, self.k, layout)
        self.graphs[(bs, spec)].replay()
        return self.outputs[(bs, spec)][:n]

    def replay_debug_dump(self, bs: int) -> Dict[str, torch.Tensor]:
        return {"mask": self.static_mask[:bs].cpu(), "ids": self.static_ids[:bs].cpu()}  # ok: FC101
