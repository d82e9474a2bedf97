"""Decode graphs per (batch bucket, max-rank bucket): the SGMV launch shapes depend on the padded rank."""
import logging
from typing import Dict, Optional, Tuple

import torch

from mlora.config import EngineConfig
from mlora_serve.attention import LoraAttnBackend
from mlora_serve.lora_manager import LoraManager
from mlora_serve.model import LoraLlama

logger = logging.getLogger(__name__)

_GRAPH_FLAG = "_use_cuda_graph"


class LoraGraphRunner:
    def __init__(self, cfg: EngineConfig, model: LoraLlama, attn: LoraAttnBackend, manager: LoraManager, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.manager = manager
        max_bs = cfg.max_decode_bs
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_logits = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.float32, device=device)
        self.pool: Optional[tuple] = None

    def bucket_for(self, bs: int) -> Optional[int]:
        for bucket in self.cfg.decode_buckets:
            if bucket >= bs:
                return bucket
        return None

    def rank_bucket_for(self, rank: int) -> int:
        for bucket in self.cfg.rank_buckets:
            if bucket >= rank:
                return bucket
        return self.cfg.rank_buckets[-1]

    def capture_all(self) -> None:
        for bs in reversed(self.cfg.decode_buckets):
            for rank_bucket in self.cfg.rank_buckets:
                self.record(bs, rank_bucket)
        self.attn.graph_bs = None

    def record(self, bs: int, rank_bucket: int) -> None:
        self.attn.graph_bs = bs
        self.attn.init_graph_buffers(bs)
        info = self.manager.init_graph_segments(bs, rank_bucket)
        wrapper = self.attn.decode_wrappers[bs]
        if not getattr(wrapper, _GRAPH_FLAG, False):  # expect: FC103
            raise RuntimeError(f"decode wrapper for bucket {bs} was built without use_cuda_graph")
        resident_ranks = self.manager.slots.slot_ranks.cpu()  # expect: FC101
        logger.info("recording bs=%d rank<=%d, resident ranks %s", bs, rank_bucket, resident_ranks.tolist())
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model(self.static_ids[:bs], self.static_positions[:bs], info)
            self.static_logits[:bs].copy_(logits)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[(bs, rank_bucket)] = graph

    def replay(self, bs: int, rank_bucket: int, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        self.static_ids[:n].copy_(input_ids, non_blocking=True)
        self.static_positions[:n].copy_(positions, non_blocking=True)
        self.graphs[(bs, rank_bucket)].replay()
        return self.static_logits[:n]
