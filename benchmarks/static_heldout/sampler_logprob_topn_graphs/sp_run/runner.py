"""The model runner: a decode graph and a sampler graph per bucket, host bookkeeping after."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import flashcheck
import numpy as np
import torch

from sampling import Detokenizer, ModelConfig, SamplingParams, SamplingTensors, StreamingResponseBuilder, TokenHistory
from sp_graphs.attn import BackendLimits, DecodeBackend
from sp_graphs.kernels import advance_last_page_kernel, grid_for
from sp_graphs.sampler_graphs import SamplerGraphs
from sp_run.model import TinyLM


@dataclass
class StepBatch:
    rows: np.ndarray
    params: List[SamplingParams]
    input_ids: torch.Tensor
    kv_indptr_np: np.ndarray
    kv_indices: torch.Tensor

    @property
    def num_rows(self) -> int:
        return len(self.rows)


class ModelRunner:
    def __init__(self, cfg: ModelConfig, detok: Detokenizer, device: torch.device):
        self.cfg = cfg
        self.device = device
        limits = BackendLimits(
            max_batch=cfg.max_batch, num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim, page_size=cfg.page_size, buckets=cfg.buckets,
            # split-k partials and LSEs of the largest bucket at the longest context
            graph_workspace_bytes=cfg.max_batch * cfg.num_qo_heads * (cfg.max_tokens // 256) * (cfg.head_dim + 1) * 4,
        )
        self.backend = DecodeBackend(limits, device)
        self.model = TinyLM(cfg, self.backend).to(device)
        kv_shape = (cfg.num_layers, limits.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(kv_shape, dtype=torch.bfloat16, device=device)
        self.tensors = SamplingTensors(cfg.max_batch, device)
        self.sampler = SamplerGraphs(cfg, self.tensors, device)
        self.history = TokenHistory(cfg.max_batch, cfg.max_tokens)
        self.responder = StreamingResponseBuilder(self.history, detok)
        self.static_ids = torch.zeros(cfg.max_batch, dtype=torch.int64, device=device)
        self.decode_graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.decode_logits: Dict[int, torch.Tensor] = {}
        self.packed_staging = torch.zeros(cfg.max_batch, 1 + cfg.max_top_n, dtype=torch.int64, pin_memory=True)
        self.stream = torch.cuda.Stream()

    def capture_all(self) -> None:
        self.backend.check_layouts()
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.capture_decode(bs)
            self.sampler.capture_bucket(bs, self.stream)

    def capture_decode(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self.decode_logits[bs] = self.model.forward_decode(self.static_ids[:bs], self.kv_cache)
        self.decode_graphs[bs] = graph

    def admit(self, row: int, rid: int, params: SamplingParams, prompt_pages: np.ndarray) -> None:
        self.history.add_request(row, params.max_tokens)
        self.responder.open(row, rid, params)
        self.backend.sink.set_sink_pages(row, prompt_pages)
        self.sampler.reset_rows(torch.tensor([row], device=self.device))

    def prefill(self, input_ids: torch.Tensor, qo_indptr_np: np.ndarray, kv_indptr_np: np.ndarray,
                kv_indices: torch.Tensor, last_page_len_np: np.ndarray) -> torch.Tensor:
        self.backend.plan_prefill(qo_indptr_np, kv_indptr_np, kv_indices, last_page_len_np)
        return self.model.forward_prefill(input_ids, self.kv_cache)

    @flashcheck.hot_path
    def execute(self, batch: StepBatch) -> List[dict]:
        n = batch.num_rows
        bs = self.cfg.bucket_for(n)
        self.tensors.stage(batch.params)
        self.static_ids[:n].copy_(batch.input_ids)
        self.backend.plan_bucket(bs, n, batch.kv_indptr_np, batch.kv_indices)
        self.decode_graphs[bs].replay()
        out = self.sampler.replay_bucket(bs, n, self.decode_logits[bs][:n])
        advance_last_page_kernel[grid_for(n)](self.backend.kv_last_page_len, self.cfg.page_size, n, BLOCK=256)  # expect: FC104

        self.packed_staging[:n].copy_(self.sampler.packed[:n], non_blocking=True)
        packed_np = self.packed_staging.numpy()[:n]  # expect: FC101
        finished = self.history.record_step(batch.rows, packed_np[:, 0])
        chunks = self.responder.emit(batch.rows, packed_np, out)
        index_of = {row: i for i, row in enumerate(batch.rows.tolist())}
        for row in finished.tolist():
            chunks[index_of[row]]["finish_reason"] = "length"
        return chunks
