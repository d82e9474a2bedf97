"""Decode graphs per batch bucket on the decode cluster."""
import logging
from typing import Dict, Optional

import torch

from xdc.config import DecodeClusterConfig
from xdc_decode.attention import MlaDecodeAttention
from xdc_decode.model import DeepseekDecoder

logger = logging.getLogger(__name__)


class DecodeGraphs:
    def __init__(self, cfg: DecodeClusterConfig, model: DeepseekDecoder, attn: MlaDecodeAttention, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        max_bs = cfg.max_decode_bs
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_logits = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.float32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool: Optional[tuple] = None

    def bucket_for(self, bs: int) -> Optional[int]:
        for bucket in self.cfg.decode_buckets:
            if bucket >= bs:
                return bucket
        return None

    def capture_everything(self) -> None:
        for bs in reversed(self.cfg.decode_buckets):
            self.attn.graph_bs = bs
            self.record(bs)
        self.attn.graph_bs = None

    def record(self, bs: int) -> None:
        self.attn.init_capture_tables(bs)
        torch.cuda.synchronize()  # ok: FC101
        warm_tokens = int(self.attn.kv_lens[:bs].sum())  # expect: FC101
        logger.info("recording decode bucket %d (%d warm-up tokens)", bs, warm_tokens)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model(self.static_ids[:bs], self.static_positions[:bs])
            self.static_logits[:bs].copy_(logits)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph

    def launch(self, bs: int, real_bs: int, ids_host: torch.Tensor, pos_host: torch.Tensor) -> torch.Tensor:
        self.static_ids[:real_bs].copy_(ids_host, non_blocking=True)
        self.static_positions[:real_bs].copy_(pos_host, non_blocking=True)
        self.graphs[bs].replay()
        return self.static_logits[:real_bs]
