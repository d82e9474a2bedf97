"""Engine: one decode step = GPU part (graph or eager) per layer, q to the host, CPU attention over the host pages,
(o, lse) back on a side stream, LSE merge, rest of the layer."""

from __future__ import annotations

import math
from typing import Dict, List

import torch
from flashinfer import merge_state

import flashcheck
from offattn.batch import OffloadBatch
from offattn.config import OffloadConfig
from offattn.cpu_worker import CPUAttentionWorker
from offattn.gpu_pool import GPUPagePool
from offattn.host_pages import HostPageStore
from offattn.staging import PinnedStaging
from offload_rt.decode_graph import OffloadDecodeGraph
from offload_rt.gpu_attention import RecentWindowAttention
from offload_rt.model import OffloadLM
from offload_rt.spill import PageSpiller


class OffloadEngine:
    def __init__(self, cfg: OffloadConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.pool = GPUPagePool(cfg, device)
        self.store = HostPageStore(cfg)
        self.staging = PinnedStaging(cfg, device)
        self.attn = RecentWindowAttention(cfg, self.pool, device)
        self.model = OffloadLM(cfg, self.attn).to(device)
        self.graph = OffloadDecodeGraph(cfg, self.model, self.attn, device)
        self.spiller = PageSpiller(cfg, self.pool, self.store, self.attn)
        self.cpu_worker = CPUAttentionWorker(self.store, self.staging, cfg.head_dim ** -0.5)
        self.seq_lens: Dict[int, int] = {}
        self.graph.capture_gpu_part()
        self.cpu_worker.start()

    def run(self, rids: List[int], last_tokens: List[int]) -> torch.Tensor:
        for rid in rids:
            self.seq_lens[rid] = self.seq_lens.get(rid, 0) + 1
        batch = OffloadBatch.build(rids, [self.seq_lens[r] for r in rids], last_tokens, self.cfg, self.pool,
                                   self.store, self.device)
        return self.decode_step(batch)

    @flashcheck.hot_path
    def decode_step(self, batch: OffloadBatch) -> torch.Tensor:
        cfg, st = self.cfg, self.staging
        n = batch.num_rows
        self.spiller.spill_overflow(batch)
        if n > self.staging.q_host.shape[0]:
            self.staging.q_host = torch.empty((n, cfg.num_qo_heads, cfg.head_dim), dtype=torch.bfloat16, pin_memory=True)  # ok: FC107
            self.staging.o_dev.resize_(n, cfg.num_qo_heads, cfg.head_dim)  # expect: FC107
        bs = self.graph.bucket_for(n)
        self.attn.active_bs = bs
        if bs is not None:
            self.attn.prepare_gpu_replay(bs, batch)
        else:
            self.attn.plan_eager(batch)
        self.attn.check_layout("NHD")
        cpu_rows = batch.rows_np[batch.host_lens_np > 0]  # ok: FC101
        n_chunks = math.ceil(batch.max_host_len_dev / cfg.cpu_chunk_tokens)  # expect: FC101
        tables: List[List[int]] = [self.store.tables.get(batch.rids[i], []) for i in cpu_rows]
        h = self.model.embed(batch.input_ids)
        for layer in self.model.layers:
            if bs is not None:
                o_gpu, lse_gpu, q = self.graph.replay_gpu_part(bs, layer.layer_id, h, batch)
            else:
                o_gpu, lse_gpu, q = layer.gpu_part(h, batch)
            st.q_host[:n].copy_(q, non_blocking=True)  # ok: FC101
            st.q_ready.record()
            self.cpu_worker.submit(layer.layer_id, n, self._row_tables(batch, tables, cpu_rows), n_chunks)
            torch.cuda.current_stream().wait_event(self.cpu_worker.result())
            o, _ = merge_state(o_gpu, lse_gpu, st.o_dev[:n], st.lse_dev[:n])
            h = layer.post_attention(h, o)
        return self.model.head(self.model.norm(h))

    def _row_tables(self, batch: OffloadBatch, tables: List[List[int]], cpu_rows) -> List[List[int]]:
        # rows without host pages get an empty table: their LSE stays -inf and the merge keeps the GPU part
        out: List[List[int]] = [[] for _ in range(batch.num_rows)]
        for i, t in zip(cpu_rows, tables):
            out[int(i)] = t
        return out
