"""Decode CUDA graphs, one per batch size in ``cuda_graph_bs``."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from mtm.config import EngineConfig
from mtm.kvcache import ForwardBatch
from mtm.parallel.tp import TPGroup
from mtm_engine.backends import FlashInferMLABackend
from mtm_engine.model import DeepseekModel

_FLOAT_WS_ATTR = "_float_workspace_buffer"


class CudaGraphRunner:
    def __init__(self, model: DeepseekModel, backend: FlashInferMLABackend, cfg: EngineConfig,
                 device: torch.device, tp: TPGroup):
        self.model, self.backend, self.tp, self.device = model, backend, tp, device
        self.bs_list = sorted(cfg.cuda_graph_bs)
        max_bs = self.bs_list[-1]
        self.input_buffers: Dict[str, torch.Tensor] = {
            "input_ids": torch.zeros(max_bs, dtype=torch.int64, device=device),
            "positions": torch.zeros(max_bs, dtype=torch.int64, device=device),
            "seq_lens": torch.ones(max_bs, dtype=torch.int32, device=device),
            "req_pool_indices": torch.zeros(max_bs, dtype=torch.int64, device=device),
            "out_cache_loc": torch.zeros(max_bs, dtype=torch.int64, device=device),
        }
        self.seq_lens_cpu = torch.ones(max_bs, dtype=torch.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.capture_max_len: Dict[int, int] = {}
        self.mem_report: Dict[int, int] = {}
        self.pool: Optional[tuple] = None

    def _static_batch(self, bs: int) -> ForwardBatch:
        b = self.input_buffers
        return ForwardBatch(
            mode="decode", input_ids=b["input_ids"][:bs], positions=b["positions"][:bs], seq_lens=b["seq_lens"][:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs], req_pool_indices=b["req_pool_indices"][:bs],
            out_cache_loc=b["out_cache_loc"][:bs],
        )

    def capture(self) -> None:
        with self.tp.graph_capture_context():
            for bs in reversed(self.bs_list):
                self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        self.capture_max_len[bs] = int(fb.seq_lens.max().item())  # expect: FC101
        for _ in range(2):  # compile the helpers, let the indexers allocate their score buffers
            self.model.forward_decode(fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(fb)
        self.pool = g.pool()
        self.graphs[bs], self.outputs[bs] = g, out
        w = self.backend.graph_mla[bs]
        self.mem_report[bs] = getattr(w, _FLOAT_WS_ATTR).numel()  # expect: FC103

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        bs = fb.batch_size
        padded = self.backend.graph_bs_for(bs)
        b = self.input_buffers
        for name in ("input_ids", "seq_lens", "req_pool_indices", "out_cache_loc"):
            b[name][:bs].copy_(getattr(fb, name))
        b["seq_lens"][bs:padded].fill_(1)
        b["out_cache_loc"][bs:padded].zero_()
        self.input_buffers["positions"] = fb.positions.clone()  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
