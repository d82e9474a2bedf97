"""Decode CUDA-graph runner: one graph per ``cfg["cuda_graph"]["batch_sizes"]`` entry."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional

import torch

from nct_cfg.defaults import DEFAULT_CONFIG
from nct_cfg.tables import PLAN_STATE_FIELDS
from nctllm.attn_op import FlashInferAttnOp
from nctllm.metadata import FlashInferAttentionMetadata, FlashInferMetadataBuilder, StepInputs
from nctllm.model import DecoderModel
from nctllm.sampler import Sampler

logger = logging.getLogger(__name__)

# graph inputs the runner owns; the captured graphs read them by address
_STATIC_INPUTS = ("input_ids", "positions")


def _check_batch_sizes(sizes: List[int]) -> List[int]:
    assert sizes == sorted(sizes) and sizes[0] >= 1, "cuda_graph.batch_sizes must be sorted"  # expect: FC109
    return list(sizes)


class CUDAGraphRunner:
    def __init__(self, cfg: Mapping[str, Any], model: DecoderModel, attn_op: FlashInferAttnOp,
                 builder: FlashInferMetadataBuilder, sampler: Sampler, device: torch.device):
        self.batch_sizes = _check_batch_sizes(cfg["cuda_graph"]["batch_sizes"])
        self.graph_cfg = {**DEFAULT_CONFIG["cuda_graph"], **cfg.get("cuda_graph", {})}
        self.max_bs = self.batch_sizes[-1]
        self.max_seq_len = self.graph_cfg.get("max_seq_len", 8192)
        self.page_size = cfg["attention"].get("page_size", 16)
        self.model = model
        self.attn_op = attn_op
        self.builder = builder
        self.sampler = sampler
        self.device = device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.plan_state: Dict[int, dict] = {}
        self.pool: Optional[tuple] = None
        attn_op.init_cuda_graph_state(self.batch_sizes)

    def _capture_meta(self, bs: int) -> FlashInferAttentionMetadata:
        return FlashInferAttentionMetadata(
            batch_size=bs,
            num_prefills=0,
            num_decodes=bs,
            seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            qo_indptr=torch.arange(bs + 1, dtype=torch.int32, device=self.device),
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
            kv_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
            num_kv_pages=bs,
            max_seq_len=1,
            use_graph=True,
            kv_indptr_gpu=torch.arange(bs + 1, dtype=torch.int32, device=self.device),
            kv_last_page_len_gpu=torch.ones(bs, dtype=torch.int32, device=self.device),
            slot_mapping=self.builder.bufs["slot_mapping"][:bs],
        )

    def record_graphs(self) -> None:
        """Capture every configured batch size, largest first, into one memory pool."""
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.batch_sizes):
            meta = self._capture_meta(bs)
            self.attn_op.prepare_cuda_graph(meta, bs)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                logits = self.model(self.input_ids[:bs], self.positions[:bs], meta)
                tokens = self.sampler.sample(logits, bs)
            self.pool = g.pool()
            self.graphs[bs] = g
            self.outputs[bs] = tokens
            logger.info("captured decode graph bs=%d", bs)
            w = self.attn_op.graph_wrappers[bs]
            self.plan_state[bs] = {name: getattr(w, name) for name in PLAN_STATE_FIELDS}  # expect: FC103
        torch.cuda.synchronize()

    def replay(self, meta: FlashInferAttentionMetadata, inputs: StepInputs) -> Optional[torch.Tensor]:
        bs = meta.batch_size
        if bs > max(self.batch_sizes):  # ok: FC101
            raise ValueError(f"batch {bs} has no decode graph (largest {self.max_bs}); lens={meta.seq_lens}")  # ok: FC101
        if meta.seq_lens.max() > self.max_seq_len:  # expect: FC101
            return None
        padded = next(b for b in self.batch_sizes if b >= bs)
        for name in _STATIC_INPUTS:
            setattr(self, name, getattr(inputs, name).clone())  # expect: FC107
        self.attn_op.prepare_cuda_graph(meta, padded)
        self.attn_op.last_page_len[:bs].clamp_(min=1)  # expect: FC104
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]

    def debug_dump(self) -> Dict[int, dict]:
        return {bs: dict(state) for bs, state in self.plan_state.items()}
