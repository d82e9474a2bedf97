"""Decode graphs per batch bucket."""

import logging
from typing import Dict, List

import torch

from epd.config import EPDConfig
from epd_decode.decode_attn import DecodeAttnBackend, DecodeBatch
from epd_decode.model import DecodeLM

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, cfg: EPDConfig, model: DecodeLM, backend: DecodeAttnBackend, kv_caches: List[torch.Tensor]) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.device = cfg.device
        max_bs = max(cfg.decode_buckets)
        self.static_bufs = {
            "input_ids": torch.zeros(max_bs, dtype=torch.long, device=cfg.device),
            "mrope_positions": torch.zeros(3, max_bs, dtype=torch.long, device=cfg.device),
        }
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def bucket_for(self, bs: int) -> int:
        for b in self.cfg.decode_buckets:
            if b >= bs:
                return b
        return -1

    def capture_one_batch_size(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids = self.static_bufs["input_ids"][:bs]
        pos = self.static_bufs["mrope_positions"][:, :bs]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(ids, pos, self.kv_caches, bs)
        self.graphs[bs] = g
        self.outputs[bs] = out
        logger.info(f"captured decode bs={bs}, largest position {pos.max()}")  # expect: FC101

    def replay(self, fb: DecodeBatch) -> torch.Tensor:
        real = fb.batch_size
        bs = self.bucket_for(real)
        self.static_bufs["input_ids"][:real].copy_(fb.input_ids)
        self.static_bufs["mrope_positions"] = fb.mrope_positions.clone()  # expect: FC107
        fb.padded_seq_lens = torch.ones(bs, dtype=torch.int32, device=self.device)  # ok: FC107
        fb.padded_seq_lens[:real].copy_(fb.seq_lens)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[bs].replay()
        return self.outputs[bs][:real]
