"""Decode CUDA graphs per batch bucket (all layers; staged layers read the staging pool)."""

import logging
from typing import TYPE_CHECKING, Callable, Dict, Tuple

import torch

from kvtier.config import TierConfig

if TYPE_CHECKING:
    from kvtier_engine.attention import TieredAttention
    from kvtier_engine.server import StepBatch, TieredModel

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, cfg: TierConfig, model: "TieredModel", attn: "TieredAttention", device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.device = device
        max_bs = cfg.max_batch_size
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def capture_bucket(self, bs: int, dummy: "StepBatch") -> None:
        self.attn.capturing = True
        self.attn.stage_decode(dummy, bs)
        self.attn.plan_staged(dummy, bs)
        for _ in range(2):
            self.model.decode_body(self.input_ids[:bs], self.positions[:bs], bs)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            self.outputs[bs] = self.model.decode_body(self.input_ids[:bs], self.positions[:bs], bs)
        self.graphs[bs] = g
        self.attn.capturing = False

    def capture_all(self, make_dummy: Callable[[int], "StepBatch"]) -> None:
        for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
            self.capture_bucket(bs, make_dummy(bs))
        logger.info("captured %d decode graphs", len(self.graphs))

    def check_capacity(self, bs: int, nnz: int) -> None:
        w = self.attn.graph_wrappers[bs]
        cap = w._paged_kv_indices_buf.shape[0]  # expect: FC103
        if nnz > cap:
            raise RuntimeError(f"decode batch needs {nnz} page slots, graph buffers hold {cap}")

    def replay(self, batch: "StepBatch", bs: int) -> torch.Tensor:
        real = batch.num_decode
        self.input_ids[:real].copy_(batch.input_ids_dev[:real], non_blocking=True)
        self.positions[:real].copy_(batch.positions_dev[:real], non_blocking=True)
        self.graphs[bs].replay()
        return self.outputs[bs][:real]
