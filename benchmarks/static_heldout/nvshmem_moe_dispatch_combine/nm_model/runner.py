"""Piecewise decode graphs: one captured attention segment per (bucket, layer); the MoE
all-to-all runs eagerly between the segments."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from nvmoe import A2ADispatcher, MoEConfig
from nm_attn.backend import MoEAttentionBackend
from nm_attn.batch import StepBatch
from nm_model.layers import AttnBlock, MoEBlock, MTPHead


class ModelRunner:
    def __init__(self, cfg: MoEConfig, group: dist.ProcessGroup, device: torch.device):
        self.cfg, self.device = cfg, device
        self._use_cuda_graph = cfg.enable_cuda_graph  # ok: FC103
        kv_cache = torch.zeros(cfg.num_layers, cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
                               dtype=torch.float8_e4m3fn, device=device)
        self.backend = MoEAttentionBackend(cfg, kv_cache, device)
        self.dispatcher = A2ADispatcher(cfg, cfg.capacity_factor, group, scratch=self.backend.kv_indptr, device=device)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size).to(device)
        self.attn = nn.ModuleList([AttnBlock(cfg, i, self.backend) for i in range(cfg.num_layers)]).to(device)
        self.moe = nn.ModuleList([MoEBlock(cfg, self.dispatcher) for _ in range(cfg.num_layers)]).to(device)
        self.mtp = MTPHead(cfg, self.backend).to(device)
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        max_bs = self.buckets[-1]
        # segment inputs: layer i's attention reads seg_inputs[i]; seg_inputs[L] feeds the MTP head
        self.seg_inputs = [torch.zeros(max_bs, cfg.hidden_size, dtype=torch.bfloat16, device=device)
                           for _ in range(cfg.num_layers + 1)]
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.seg_outputs: Dict[Tuple[int, int], torch.Tensor] = {}
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        if self._use_cuda_graph:
            self.capture_decode_graphs()

    def capture_decode_graphs(self) -> None:
        self.backend.init_graph_wrappers(self.buckets)
        torch.cuda.synchronize()  # ok: FC101
        L = self.cfg.num_layers
        for bs in reversed(self.buckets):
            self.backend.prepare_bucket(bs, bs, [[0]] * bs, np.ones(bs, dtype=np.int32))
            for i, attn in enumerate(self.attn):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    self.seg_outputs[(bs, i)] = attn(self.seg_inputs[i][:bs], self.static_out_loc[:bs], bs)
                self.graphs[(bs, i)] = g
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self.seg_outputs[(bs, L)] = self.mtp(self.seg_inputs[L][:bs])
            self.graphs[(bs, L)] = g

    def disable_graphs_for(self, bs: int) -> None:
        """Serve a bucket eagerly after a capture failure, reusing its wrapper."""
        setattr(self.backend.graph_wrappers[bs], "_use_cuda_graph", False)  # expect: FC103

    def replay_stats(self) -> Dict[str, object]:
        return {"recv_counts": self.dispatcher.recv_counts.tolist(), **self.dispatcher.stats}  # ok: FC101

    def _bucket_for(self, bs: int) -> int:
        return next(b for b in self.buckets if b >= bs)

    def execute(self, batch: StepBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        bs = batch.batch_size
        if not self._use_cuda_graph or bs > self.buckets[-1]:
            return self._execute_eager(batch)
        padded = self._bucket_for(bs)
        L = self.cfg.num_layers
        self.backend.prepare_bucket(bs, padded, batch.page_lists, batch.seq_lens_np)
        self.static_out_loc[:bs].copy_(batch.out_loc)
        self.seg_inputs[0][:bs].copy_(self.embed(batch.input_ids))
        for i, moe in enumerate(self.moe):
            self.graphs[(padded, i)].replay()
            h = moe(self.seg_outputs[(padded, i)])
            # the combine output is a view of the dispatcher's reused buffer: keep a copy
            self.seg_inputs[i + 1] = h.clone()  # expect: FC107
        self.graphs[(padded, L)].replay()
        return self.seg_outputs[(padded, L)][:bs], self.seg_inputs[L][:bs]

    def _execute_eager(self, batch: StepBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        self.backend.plan_eager(batch)
        h = self.embed(batch.input_ids)
        for attn, moe in zip(self.attn, self.moe):
            h = moe(attn.forward_eager(h, batch.out_loc))
        return self.mtp.head(self.mtp.norm(h)), h

    def execute_prefill(self, batch: StepBatch) -> torch.Tensor:
        self.backend.plan_prefill(batch)
        h = self.embed(batch.input_ids)
        for attn, moe in zip(self.attn, self.moe):
            h = moe(attn.forward_prefill(h, batch.out_loc))
        return h
