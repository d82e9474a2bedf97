"""One (TP rank, PP stage) worker: its slice of the layers, its attention, its graphs."""

import logging
import os
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from tpp.config import HybridConfig
from tpp.dist.comm import StageComm
from tpp.metadata import MicroBatch, make_microbatch
from tpp_stage.attention import StageAttention
from tpp_stage.graphs import StageGraphs, StaticInputs

logger = logging.getLogger(__name__)


class StageLayer(nn.Module):
    def __init__(self, cfg: HybridConfig, layer_id: int, attn: StageAttention, comm: StageComm):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.attn = attn
        self.comm = comm
        heads = cfg.heads_per_rank
        kv_heads = cfg.kv_heads_per_rank
        self.q_proj = nn.Linear(cfg.hidden_size, heads * cfg.head_dim, bias=False)
        self.kv_proj = nn.Linear(cfg.hidden_size, 2 * kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.register_buffer(
            "kv_cache",
            torch.zeros(cfg.max_pages, 2, cfg.page_size, kv_heads, cfg.head_dim, dtype=torch.bfloat16),
            persistent=False,
        )

    def forward(self, h: torch.Tensor, positions: torch.Tensor, m: int, bs: int, chunk: int) -> torch.Tensor:
        heads = self.cfg.heads_per_rank
        kv_heads = self.cfg.kv_heads_per_rank
        q = self.q_proj(h).view(-1, heads, self.cfg.head_dim)
        k, v = self.kv_proj(h).view(-1, 2, kv_heads, self.cfg.head_dim).unbind(1)
        out_dec = self.attn.forward_decode(q[:bs], self.kv_cache, m, bs)
        if chunk:
            out_chunk = self.attn.forward_chunk(q[bs:], k[bs:], v[bs:])
            o = torch.cat([out_dec, out_chunk], dim=0)
        else:
            o = out_dec
        return h + self.comm.all_reduce_(self.o_proj(o.reshape(h.shape[0], -1)))


class PipelineStage(nn.Module):
    def __init__(self, cfg: HybridConfig, stage_idx: int, layer_range: Tuple[int, int], attn: StageAttention,
                 comm: StageComm):
        super().__init__()
        assert layer_range[0] < layer_range[1], "a stage must own at least one layer"  # expect: FC109
        self.cfg = cfg
        self.stage_idx = stage_idx
        self.layers = nn.ModuleList([StageLayer(cfg, i, attn, comm) for i in range(*layer_range)])

    def forward_tokens(self, h: torch.Tensor, positions: torch.Tensor, m: int, bs: int, chunk: int) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h, positions, m, bs, chunk)
        return h


class StageWorker:
    def __init__(self, cfg: HybridConfig, tp_group, pp_group, device):
        self.cfg = cfg
        self.device = device
        self.tp_size = cfg.tp_size
        self.pp_size = cfg.pp_size
        self._world = dist.get_world_size()
        self._check_world()
        self.stage = dist.get_group_rank(pp_group, dist.get_rank())
        self.attn = StageAttention(cfg, self.stage, device)
        self.comm = StageComm(
            tp_group, pp_group, self.stage, cfg.pp_size, cfg.hidden_size, self.attn, device,
            deterministic=os.environ.get("TPP_DETERMINISTIC", "0") == "1",
        )
        self.model = PipelineStage(cfg, self.stage, cfg.layers_of(self.stage), self.attn, self.comm).to(device)
        self.graphs = StageGraphs(cfg, self.model, self.attn, device)
        self.positions_base = torch.zeros(self.attn.max_tokens, dtype=torch.int64, device=device)

    def _check_world(self) -> None:
        assert self.tp_size * self.pp_size == self._world, "world size does not match TP x PP"  # ok: FC109

    def _bucket(self, n: int) -> Optional[int]:
        for b in self.cfg.graph_batch_sizes:
            if b >= n:
                return b
        return None

    def warm_up(self, chunk_buckets: List[int]) -> None:
        for m in range(self.cfg.num_microbatches):
            for bs in self.cfg.graph_batch_sizes:
                lens = np.full(bs, self.cfg.page_size, dtype=np.int64)
                rows = [np.array([i], dtype=np.int32) for i in range(bs)]
                for chunk in chunk_buckets:
                    mb = make_microbatch(m, lens, rows, np.array([chunk], dtype=np.int64), self.cfg.page_size,
                                         self.device)
                    self.graphs.record_bucket(mb, bs, chunk)

    def run_step(self, mbs: List[MicroBatch], embeds: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
        outs = []
        for mb in mbs:
            logger.info(f"stage {self.stage} micro-batch {mb.index}: seq_lens={mb.seq_lens}")  # expect: FC101
            hidden = self.comm.recv_activations(mb.index)
            if hidden is None:
                hidden = embeds[: mb.total_tokens_host]
            positions = torch.repeat_interleave(  # ok: FC101
                self.positions_base[: mb.token_counts.shape[0]], mb.token_counts, output_size=mb.total_tokens_host
            )
            bs = self._bucket(mb.num_decode)
            chunk = mb.num_chunk_tokens
            if bs is not None and self.graphs.has(mb.index, bs, chunk):
                self.attn.prepare_microbatch(mb, bs)
                out = self.graphs.replay_mb(mb, StaticInputs(hidden, positions), bs, chunk)
            else:
                self.attn.prepare_microbatch(mb, mb.num_decode)
                out = self.model.forward_tokens(hidden, positions, mb.index, mb.num_decode, chunk)
            self.comm.send_activations(out, mb.index, mb.num_decode)
            outs.append(out)
        self.attn.reset()
        return outs


class StageDriver:
    """Stage 0's loop: cut the running batch into micro-batches and push them down the pipe."""

    def __init__(self, worker: StageWorker, scheduler):
        self.worker = worker
        self.scheduler = scheduler

    def loop_once(self) -> int:
        cfg = self.worker.cfg
        batches = self.scheduler.next_microbatches(cfg.num_microbatches)
        mbs = [
            make_microbatch(i, b.lens_np, b.page_rows, b.chunk_lens_np, cfg.page_size, self.worker.device)
            for i, b in enumerate(batches)
        ]
        embeds = self.scheduler.embed_tokens(batches)
        self.worker.run_step(mbs, embeds)
        return len(mbs)
