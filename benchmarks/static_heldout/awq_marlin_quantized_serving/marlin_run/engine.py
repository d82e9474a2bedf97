"""The AWQ engine: load, autotune, capture, then prefill and decode steps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping

import numpy as np
import torch

from awq import AWQServeConfig, AWQWeightLoader, MarlinAutotuner, last_page_lens
from awq.paging import kv_indptr_from_lens
from marlin_attn.backend import AWQAttnBackend
from marlin_attn.metadata import AWQMetadataBuilder, StepInputs
from marlin_run.graph_runner import DecodeGraphRunner
from marlin_run.model import QuantLlama


@dataclass
class Request:
    rid: int
    token_ids: List[int]
    pages: List[int]
    num_computed: int = 0

    @property
    def seq_len(self) -> int:
        return len(self.token_ids)


class AWQEngine:
    def __init__(self, cfg: AWQServeConfig, device: torch.device, checkpoint: Mapping[str, torch.Tensor]):
        self.cfg = cfg
        self.device = device
        self.loader = AWQWeightLoader(cfg, device)
        self.loader.load_checkpoint(checkpoint)
        self.backend = AWQAttnBackend(cfg, device)
        self.backend.init_graph_wrappers()
        kv_caches = [
            torch.zeros(cfg.max_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
                        dtype=cfg.kv_dtype, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.model = QuantLlama(cfg, self.loader, self.backend, kv_caches)
        self.builder = AWQMetadataBuilder(cfg, device)
        self.runner = DecodeGraphRunner(self.backend, self.model, cfg.buckets, device)
        self.tuner = MarlinAutotuner(device)

    def warmup(self) -> None:
        for layer in self.model.quant_linears():
            self.tuner.tune(layer, self.cfg.buckets)
        self.runner.capture_all()

    def _make_inputs(self, reqs: List[Request], is_prefill: bool) -> StepInputs:
        lens_np = np.array([r.seq_len for r in reqs], dtype=np.int32)
        if is_prefill:
            q_np = np.array([r.seq_len - r.num_computed for r in reqs], dtype=np.int32)
            ids = [t for r in reqs for t in r.token_ids[r.num_computed:]]
            pos = [p for r in reqs for p in range(r.num_computed, r.seq_len)]
        else:
            q_np = np.ones(len(reqs), dtype=np.int32)
            ids = [r.token_ids[-1] for r in reqs]
            pos = [r.seq_len - 1 for r in reqs]
        qo_indptr_np = np.concatenate([[0], np.cumsum(q_np)]).astype(np.int32)
        pages = [p for r in reqs for p in r.pages]
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            positions=torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(lens_np).to(self.device, non_blocking=True),
            seq_lens_cpu=torch.from_numpy(lens_np),
            qo_indptr_cpu=torch.from_numpy(qo_indptr_np),
            kv_indptr_cpu=torch.from_numpy(kv_indptr_from_lens(lens_np, self.cfg.page_size)),
            kv_indices=torch.tensor(pages, dtype=torch.int32).to(self.device, non_blocking=True),
            last_page_len_cpu=torch.from_numpy(last_page_lens(lens_np, self.cfg.page_size)),
            num_tokens_cpu=torch.from_numpy(q_np),
            is_prefill=is_prefill,
        )

    def prefill(self, reqs: List[Request]) -> torch.Tensor:
        inputs = self._make_inputs(reqs, is_prefill=True)
        n = sum(len(r.pages) for r in reqs)
        # stage the prompt's pages where the decode kernels already look for them
        self.backend.kv_indices_buf[:n].copy_(inputs.kv_indices[:n])  # expect: FC104
        meta = self.builder.build(inputs)
        self.backend.init_forward_metadata(meta)
        logits = self.model.forward_prefill(inputs.input_ids, inputs.positions)
        for r in reqs:
            r.num_computed = r.seq_len
        return logits

    def decode(self, reqs: List[Request]) -> torch.Tensor:
        inputs = self._make_inputs(reqs, is_prefill=False)
        meta = self.builder.build_decode(inputs)
        if meta.batch_size > self.cfg.largest_bucket or meta.long_rows:
            self.backend.plan_eager_decode(meta)
            return self.model.forward_decode(inputs.input_ids, inputs.positions)
        return self.runner.replay(inputs.input_ids, inputs.positions, meta)

    def memory_report(self) -> dict:
        return {"attn_workspace_bytes": self.backend.workspace_bytes_in_use()}
