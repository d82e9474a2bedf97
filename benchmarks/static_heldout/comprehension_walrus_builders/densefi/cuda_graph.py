"""CUDA-graph manager: one graph per (batch size, verify) pair, recorded at start-up and replayed per step."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import product
from typing import Optional

import torch
import torch.nn as nn

from densefi.attention import FlashInferBackend
from densefi.config import EngineConfig
from densefi.metadata import FlashInferMetadata

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor
    meta: FlashInferMetadata


@dataclass
class StepBatch:
    """What one graph step needs: the runner's metadata and the model inputs to stage."""

    num_reqs: int
    num_tokens: int
    meta: FlashInferMetadata
    graph_inputs: dict[str, torch.Tensor]


class CUDAGraphManager:
    _STATIC_INPUTS = (("input_ids", torch.int64), ("positions", torch.int64), ("slot_mapping", torch.int64))

    def __init__(
        self,
        cfg: EngineConfig,
        model: nn.Module,
        backend: FlashInferBackend,
        kv_caches: list[torch.Tensor],
        capture_sizes: tuple[int, ...],
        device: torch.device,
        block_table: torch.Tensor,
    ) -> None:
        first, *rest = sorted(capture_sizes)
        assert first >= 1 and all(bs <= cfg.max_num_seqs for bs in rest), "capture sizes out of range"  # expect: FC109
        self.capture_sizes = (first, *rest)
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.device = device
        max_bs = self.capture_sizes[-1]
        self.max_tokens = max_bs * (1 + cfg.num_spec_tokens)
        self.static_inputs = {
            name: torch.zeros(self.max_tokens, dtype=dt, device=device) for name, dt in self._STATIC_INPUTS
        }
        i32 = dict(dtype=torch.int32, device=device)
        self.static_seq_lens = torch.ones(max_bs, **i32)
        self.static_seq_lens_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.static_qo = torch.arange(max_bs + 1, **i32)
        self.static_qo_cpu = torch.arange(max_bs + 1, dtype=torch.int32)
        # one page per padded row: indptr steps of 1 after the last real row
        self.pad_steps = torch.arange(1, max_bs + 1, **i32)
        self.pad_steps_cpu = torch.arange(1, max_bs + 1, dtype=torch.int32)
        # the runner's block table itself: the trtllm decode kernels read it in place
        self.block_table = block_table
        self.graphs: dict[tuple[int, bool], GraphEntry] = {}
        self.pool: Optional[tuple[int, int]] = None

    # ------------------------------------------------------------------ capture

    def _capture_meta(self, bs: int, verify: bool) -> FlashInferMetadata:
        assert bs in self.capture_sizes, "only captured sizes get a dummy batch"  # ok: FC109
        q_per_req = 1 + self.cfg.num_spec_tokens if verify else 1
        n_tok = bs * q_per_req
        return FlashInferMetadata(
            num_reqs=bs,
            num_decodes=bs,
            num_decode_tokens=n_tok,
            num_prefills=0,
            num_actual_tokens=n_tok,
            max_seq_len=self.cfg.max_model_len,
            max_query_len=q_per_req,
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_cpu=self.static_seq_lens_cpu[:bs],
            query_start_loc=self.static_qo[: bs + 1] * q_per_req,
            query_start_loc_cpu=self.static_qo_cpu[: bs + 1] * q_per_req,
            slot_mapping=self.static_inputs["slot_mapping"][:n_tok],
            block_table=self.block_table[:bs],
            is_verify=verify,
            use_graph=True,
            graph_bs=bs,
            use_cascade=self.cfg.enable_cascade,
        )

    def record_all(self) -> None:
        """Warm up and record every (batch size, verify) graph, largest first so smaller ones reuse its pool."""
        torch.cuda.synchronize()  # ok: FC101
        verify_modes = (False, True) if self.cfg.num_spec_tokens else (False,)
        for bs, verify in product(reversed(self.capture_sizes), verify_modes):
            meta = self._capture_meta(bs, verify)
            n_tok = meta.num_actual_tokens
            self.backend.plan_graph_decode(bs, meta)
            ids, pos = (self.static_inputs[k][:n_tok] for k in ("input_ids", "positions"))
            for _ in range(2):
                self.model(ids, pos, meta, self.kv_caches)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.model(ids, pos, meta, self.kv_caches)
            self.pool = graph.pool()
            self.graphs[(bs, verify)] = GraphEntry(graph=graph, output=out, meta=meta)
        torch.cuda.synchronize()
        logger.info("recorded %d graphs: %s", len(self.graphs), sorted(self.graphs))

    # ------------------------------------------------------------------ per step

    def padded_size(self, num_reqs: int) -> Optional[int]:
        return next((bs for bs in self.capture_sizes if bs >= num_reqs), None)

    def stage_inputs(self, bs: int, batch: StepBatch) -> None:
        """Copy the step into the static buffers, pad the page lists of rows n..bs, plan the graph wrappers."""
        n, b = batch.num_reqs, self.backend
        for name, src in batch.graph_inputs.items():
            if (dst := self.static_inputs.get(name)) is None or dst.shape[0] < src.shape[0]:
                self.static_inputs[name] = src.clone()  # expect: FC107
            else:
                dst[: src.shape[0]].copy_(src, non_blocking=True)
        self.static_seq_lens[:n].copy_(batch.meta.seq_lens, non_blocking=True)
        self.static_seq_lens[n:bs].fill_(1)
        # padded rows attend to the reserved page 0: point their page-list entries at it before planning
        for g in b.full_groups:
            nnz = int(b.kv_indptr_cpu[g][n])
            b.kv_indices_gpu[g][nnz : nnz + bs - n].zero_()  # ok: FC104
        b.plan_graph_decode(bs, batch.meta)
        for dev, host in ((b.kv_indptr_gpu[g], b.kv_indptr_cpu[g]) for g in b.full_groups):
            dev[n + 1 : bs + 1] = dev[n] + self.pad_steps[: bs - n]  # expect: FC104
            host[n + 1 : bs + 1] = host[n] + self.pad_steps_cpu[: bs - n]  # ok: FC104

    def execute(self, bs: int, batch: StepBatch) -> torch.Tensor:
        entry = self.graphs[(bs, batch.meta.is_verify)]
        self.stage_inputs(bs, batch)
        entry.graph.replay()
        return entry.output[: batch.num_tokens]
