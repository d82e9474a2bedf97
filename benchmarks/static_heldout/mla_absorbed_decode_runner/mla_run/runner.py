"""Decode graphs per bucket over the absorbed MLA path."""

import bisect
import logging
from typing import Any, Dict, List, Optional

import torch

from mlaserve import MLAConfig
from mla_run.attention import MLAAttention
from mla_run.metadata import MLADecodeMeta
from mla_run.model import MLAModel

logger = logging.getLogger(__name__)


def _rope_rows(start: int, end: int, dim: int, device: torch.device) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    t = torch.arange(start, end, device=device, dtype=torch.float32)
    return torch.outer(t, inv).cos()


class MLADecodeRunner:
    def __init__(self, model: MLAModel, attn: MLAAttention, cfg: MLAConfig, device: torch.device):
        self.model = model
        self.attn = attn
        self.cfg = cfg
        self.device = device
        self.buckets = sorted(cfg.graph_buckets)
        self.static_ids = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)
        self.rope_cos = _rope_rows(0, 4096, cfg.qk_rope_head_dim, device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.captured_plans: Dict[int, Any] = {}
        self.replays: Dict[int, int] = {}

    def bucket(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def record_graphs(self, metas: Dict[int, MLADecodeMeta]) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.attn.init_graph_wrappers()
        pool = None
        for bs in reversed(self.buckets):
            meta = metas[bs]
            self.attn.update_decode_metadata(bs, meta)
            warm = self.model.decode(self.static_ids[:bs], meta, bs)
            if not torch.isfinite(warm).all():  # expect: FC101
                raise RuntimeError(f"bucket {bs}: non-finite warm-up logits")
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.outputs[bs] = self.model.decode(self.static_ids[:bs], meta, bs)
            pool = g.pool()
            self.graphs[bs] = g
            self.captured_plans[bs] = self.attn.graph_mla[bs]._plan_info  # expect: FC103
        torch.cuda.synchronize()

    def prepare_replay(self, bs: int, meta: MLADecodeMeta, ids: torch.Tensor) -> bool:
        n = meta.batch_size
        longest = int(meta.kv_lens_cpu.max())
        if longest >= self.rope_cos.shape[0]:
            extra = _rope_rows(self.rope_cos.shape[0], 2 * longest, self.cfg.qk_rope_head_dim, self.device)
            self.rope_cos = torch.cat([self.rope_cos, extra])  # expect: FC107
        self.static_ids[:n].copy_(ids, non_blocking=True)
        return self.attn.update_decode_metadata(bs, meta)

    def replay(self, bs: int, n: int) -> torch.Tensor:
        self.graphs[bs].replay()
        self.replays[bs] = self.replays.get(bs, 0) + 1
        return self.outputs[bs][:n]

    def debug_replay_stats(self) -> List[int]:
        lens = self.attn.kv_len_arr.tolist()  # ok: FC101
        logger.info("replays per bucket %s", self.replays)
        return lens
