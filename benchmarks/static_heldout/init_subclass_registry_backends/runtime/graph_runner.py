"""CUDA graphs per batch-size bucket, for whichever backend the registry built."""

from __future__ import annotations

import logging

import torch

from regattn import AttentionBackend, ForwardBatch, ServeConfig

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model, attn: AttentionBackend, cfg: ServeConfig):
        self.model, self.attn, self.cfg = model, attn, cfg
        self._use_cuda_graph = bool(cfg.graph_buckets)  # ok: FC103
        device, max_bs = model.embed.weight.device, max(cfg.graph_buckets)
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions_host = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = self.last_hidden = self.seq_lens_cpu = None

    def capture(self) -> None:
        assert not self.graphs, "capture() runs once per runner"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        self.attn.init_forward_metadata_capture_cuda_graph(bs)
        if self.attn.graph_wrappers[bs]._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"the graph wrapper of bucket {bs} was built for another batch size")
        ids, pos = self.static_ids[:bs], self.static_positions[:bs]
        self.model.forward_decode(ids, pos)
        torch.cuda.synchronize()  # ok: FC101
        self.outputs[bs] = torch.empty(bs, self.cfg.num_qo_heads, self.cfg.head_dim, dtype=torch.bfloat16, device=ids.device)  # ok: FC107
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[bs].copy_(self.model.forward_decode(ids, pos))
        self.pool, self.graphs[bs] = g.pool(), g
        peak = self.outputs[bs].abs().max().item()  # expect: FC101
        logger.info("captured bucket %d (|out| max %.3f)", bs, peak)
        self.attn.kv_indptr.zero_()  # expect: FC104

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        n = batch.batch_size
        assert n <= max(self.graphs), f"batch of {n} is above the largest captured bucket"  # expect: FC109
        bs = min(b for b in self.graphs if b >= n)  # ok: FC101
        if (batch.positions < 0).any():  # expect: FC101
            raise ValueError(f"negative decode positions: {batch.positions}")  # ok: FC101
        self.static_ids[:n].copy_(batch.input_ids)
        self.static_positions[:n].copy_(batch.positions)  # ok: FC104
        self.positions_host[:n].copy_(batch.positions)  # expect: FC101
        self.seq_lens_cpu = batch.seq_lens_cpu.clone()  # ok: FC107
        self.attn.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.graphs[bs].replay()
        self.last_hidden = self.outputs[bs][:n].clone()  # expect: FC107
        return self.last_hidden
