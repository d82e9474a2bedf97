"""One pipeline stage on one GPU: receive a microbatch's hidden states, run the stage, send them on."""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ppserve.comm import MicrobatchChannel
from ppserve.config import PipelineConfig, StageSpec
from ppserve.microbatch import Microbatch
from pp_stage.attention import StageAttention
from pp_stage.graphs import StageGraphRunner
from pp_stage.layers import StageLayers

logger = logging.getLogger(__name__)


class StageWorker:
    def __init__(self, cfg: PipelineConfig, spec: StageSpec, device,
                 recv_channel: Optional[MicrobatchChannel], send_channel: Optional[MicrobatchChannel]):
        self.cfg = cfg
        self.spec = spec
        self.device = torch.device(device)
        self.is_last = send_channel is None
        self.kv_cache = torch.zeros(
            spec.num_layers, cfg.num_pages_per_stage, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
            dtype=cfg.dtype, device=self.device,
        )
        self.attn = StageAttention(cfg, spec, self.device)
        self.layers = StageLayers(cfg, spec, self.kv_cache, self.is_last).to(device=self.device, dtype=cfg.dtype)
        self.graphs = StageGraphRunner(cfg, spec, self.layers, self.attn, self.device)
        self.recv_channel = recv_channel
        self.send_channel = send_channel

    def init_graphs(self) -> None:
        self.attn.init_graph_wrappers(self.graphs.buckets)
        self.graphs.record_all()

    def run_microbatch(self, mb: Microbatch) -> Optional[torch.Tensor]:
        if self.recv_channel is None:
            hidden = self.layers.embed(mb.input_ids)
            residual = None
        else:
            pkt = self.recv_channel.recv_hidden()
            if pkt.mb_id != mb.mb_id:
                raise RuntimeError(f"stage {self.spec.stage_id}: expected microbatch {mb.mb_id}, got {pkt.mb_id}")
            torch.cuda.current_stream().wait_event(pkt.ready)  # ok: FC101
            hidden, residual = pkt.hidden, pkt.residual

        bucket = None if mb.is_prefill else self.graphs.bucket_for(mb.bs)
        if bucket is not None and self.graphs.has(bucket):
            rec = self.graphs.prepare_replay(mb, hidden, residual)
            rec.graph.replay()
            out_h = rec.out_hidden[: mb.num_tokens]
            out_r = rec.out_residual[: mb.num_tokens]
        else:
            meta = self.attn.prepare_microbatch(mb, None)
            if mb.is_prefill:
                out_h, out_r = self.layers.forward_prefill(hidden, residual, mb.positions, meta)
            else:
                out_h, out_r = self.layers.forward_decode(hidden, residual, mb.positions, meta)

        if self.is_last:
            if mb.is_prefill:
                last = self._token_offsets(mb)[1:].long() - 1
                out_h, out_r = out_h[last], out_r[last]
            return self.layers.logits(out_h, out_r)
        self.send_channel.send_hidden(out_h, out_r, mb.mb_id)
        return None

    def _token_offsets(self, mb: Microbatch) -> torch.Tensor:
        # per-request token offsets of a packed prefill microbatch; the stage's indptr buffer
        # sits idle while a prefill runs, so reuse it rather than allocate every step
        offs = self.attn.kv_indptr_buf
        torch.cumsum(mb.q_lens, 0, dtype=torch.int32, out=offs[1: mb.bs + 1])  # expect: FC104
        return offs[: mb.bs + 1]
