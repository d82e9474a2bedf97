"""One sequence-parallel rank: refresh the per-rank metadata, then prefill eagerly or decode through a
recorded bucket (trtllm-gen past the largest bucket)."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import torch
import torch.distributed as dist

from ulysses.comm import UlyssesComm
from ulysses.config import UlyssesConfig
from ulysses_rt.attention import UlyssesAttention
from ulysses_rt.graphs import UlyssesGraphs
from ulysses_rt.kv import HeadShardedKV, SPBatch
from ulysses_rt.metadata import UlyssesMetadata
from ulysses_rt.model import UlyssesModel

logger = logging.getLogger(__name__)


class UlyssesWorker:
    def __init__(self, cfg: UlyssesConfig, group: dist.ProcessGroup, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.comm = UlyssesComm(group, device)
        self.kv = HeadShardedKV(cfg, self.comm.rank, self.comm.world, device)
        self.attn = UlyssesAttention(cfg, self.comm, self.kv, device)
        self.meta = UlyssesMetadata(cfg, self.comm, self.attn, device)
        self.model = UlyssesModel(cfg, self.comm, self.attn, self.kv).to(device)
        self.graphs = UlyssesGraphs(self.model, self.attn, cfg, self.comm.world, device)
        self.recv_buf = torch.empty(cfg.max_batch * cfg.hidden_size, dtype=torch.bfloat16, device=device)
        self.send_buf: Optional[torch.Tensor] = None
        self.step_id = 0

    def warmup(self) -> None:
        self.graphs.record_all()

    def _maybe_log(self, batch: SPBatch, verbose: bool) -> None:
        if verbose:
            print(batch.local_lens_gpu)  # ok: FC101

    @torch.inference_mode()
    def forward_step(self, batch: SPBatch) -> torch.Tensor:
        self.step_id += 1
        bs = len(batch.request_ids)
        self.meta.refresh(batch)
        in_flight = self.meta.seq_lens_gpu[:bs].sum()
        logger.info(f"sp step {self.step_id}: {bs} requests, {in_flight} tokens in flight")  # expect: FC101
        n_local = int(batch.local_lens_cpu.sum())
        need = n_local * self.cfg.hidden_size
        if self.recv_buf.numel() < need:
            self.recv_buf.resize_(need)  # expect: FC107
        if getattr(self, "send_buf", None) is None:
            self.send_buf = torch.empty(self.recv_buf.numel(), dtype=torch.bfloat16, device=self.device)  # ok: FC107
        self.comm.staging = self.send_buf
        self._maybe_log(batch, verbose=False)
        if batch.is_prefill:
            self.attn.prepare_prefill(batch, self.meta.seq_lens_gpu[:bs])
            return self.model.forward_prefill(batch.input_ids_gpu, batch.positions_gpu, batch.out_loc_gpu)
        bucket = self.graphs.bucket(bs)
        if bucket > 0:
            return self.graphs.run_bucket(bucket, batch)
        h = self.model.embed(batch.input_ids_gpu)
        for layer in self.model.layers:
            q, _, _ = layer._scatter(h, batch.positions_gpu, batch.out_loc_gpu)
            h = layer._gather(h, self.attn.forward_decode_large(q, layer.layer_id, batch, self.meta.max_seq_len))
        return self.model.lm_head(self.model.norm(h))

    def replay_debug_dump(self) -> Dict[str, torch.Tensor]:
        """Admin endpoint: the metadata the last recorded step read."""
        return {"kv_indptr": self.attn.kv_indptr.cpu(), "seq_lens": self.meta.seq_lens_gpu.cpu()}  # ok: FC101
