"""One decode CUDA graph per batch bucket."""
import logging
from typing import Dict, Optional

import torch

from sjson.config import ServerConfig
from sjson_rt.attention import StructuredAttention
from sjson_rt.model import JsonLM

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, cfg: ServerConfig, model: JsonLM, attn: StructuredAttention, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        max_bs = cfg.max_batch_size
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.plan_snapshots: Dict[int, object] = {}
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.static_logits = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.float32, device=device)
        self.mempool: Optional[tuple] = None

    def capture_all(self) -> None:
        self.attn.use_graph = True
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        self.attn.init_capture_metadata(bs)
        torch.cuda.synchronize()  # ok: FC101
        longest = self.static_seq_lens[:bs].max().item()  # expect: FC101
        logger.info("capturing decode bucket %d (warm-up context %d)", bs, longest)
        for _ in range(2):
            self.model.forward_decode(self.static_input_ids[:bs], self.static_positions[:bs], bs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model.forward_decode(self.static_input_ids[:bs], self.static_positions[:bs], bs)
            self.static_logits[:bs].copy_(logits)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bs] = graph
        self.plan_snapshots[bs] = self.attn.graph_wrappers[bs]._plan_info  # expect: FC103

    def replay(self, bs: int, real_bs: int, input_ids: torch.Tensor, positions: torch.Tensor, page_ids_cpu: torch.Tensor, pages_per_req_cpu: torch.Tensor, last_len_cpu: torch.Tensor) -> torch.Tensor:
        self.static_input_ids[:real_bs].copy_(input_ids, non_blocking=True)
        self.static_positions[:real_bs].copy_(positions, non_blocking=True)
        if real_bs < bs:
            self.static_input_ids[real_bs:bs].zero_()
            self.static_positions[real_bs:bs].zero_()
        self.attn.prepare_replay(bs, real_bs, page_ids_cpu, pages_per_req_cpu, last_len_cpu)
        self.graphs[bs].replay()
        return self.static_logits[:real_bs]
