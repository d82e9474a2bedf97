"""FlashInfer backend whose plan state can be snapshotted for the step recorder."""

from __future__ import annotations

import functools
import math
from typing import Any, Dict, Protocol

import flashinfer
import torch

from dr_attn.buffers import alloc_graph_buffers
from dr_attn.workspaces import prefill_workspace, trtllm_decode_workspace
from dr_engine.batch import StepBatch
from dr_engine.config import EngineConfig

Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper


class AttentionBackend(Protocol):
    def forward_decode(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor: ...

    def forward_prefill(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor: ...


class ReplayableBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.graph_bufs = alloc_graph_buffers(cfg.max_batch, cfg.max_pages, device)
        self.init_graph_buffers()
        self.graph_wrappers: Dict[int, Decode] = {}

        self.prefill_ws = prefill_workspace(cfg, device)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")
        self.eager_decode = Decode(trtllm_decode_workspace(cfg, device), "NHD", backend="trtllm-gen")
        # batch-invariant decode: tensor cores, split-kv off
        self.det_decode = Decode(self.prefill_ws, "NHD", use_tensor_cores=True)
        common = dict(
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        self._common = common
        self._eager_plan = functools.partial(self.eager_decode.plan, **common)

    # ---- set-up -----------------------------------------------------------------

    def init_graph_buffers(self) -> None:
        self.graph_bufs.indptr.zero_()  # ok: FC104
        self.graph_bufs.last_len.fill_(1)

    def init_graph_wrappers(self) -> None:
        bufs = self.graph_bufs
        for bs in self.cfg.buckets:
            self.graph_wrappers[bs] = Decode(
                bufs.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=bufs.indptr[: bs + 1],
                paged_kv_indices_buffer=bufs.indices,
                paged_kv_last_page_len_buffer=bufs.last_len[:bs],
            )

    # ---- per step ---------------------------------------------------------------

    def init_forward_metadata(self, batch: StepBatch) -> None:
        pages = math.ceil(batch.max_seq_len / self.cfg.page_size)  # expect: FC101
        if pages > self.cfg.max_pages_per_req:
            raise ValueError(f"a row needs {pages} pages, limit {self.cfg.max_pages_per_req}")
        c = self.cfg
        if batch.num_prefill:
            self.prefill.plan(  # expect: FC102
                batch.qo_indptr,
                batch.kv_indptr_cpu,
                batch.kv_indices_cpu,
                batch.last_len_cpu,
                c.num_qo_heads,
                c.num_kv_heads,
                c.head_dim,
                c.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )
            return
        if c.deterministic:
            self.det_decode.plan(
                batch.kv_indptr_cpu, batch.kv_indices_cpu, batch.last_len_cpu,
                disable_split_kv=True, **self._common,
            )
        elif batch.batch_size not in self.graph_wrappers:
            self.plan_eager(batch)

    def plan_eager(self, batch: StepBatch) -> None:
        self._eager_plan(batch.kv_indptr_cpu, batch.kv_indices_cpu, batch.last_len_cpu)  # ok: FC102

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        bufs = self.graph_bufs
        real = batch.batch_size
        bufs.indptr_host[: real + 1].copy_(batch.kv_indptr_cpu)
        nnz = int(bufs.indptr_host[real])
        bufs.indptr_host[real + 1 : bs + 1] = nnz
        bufs.indices_host[:nnz].copy_(batch.kv_indices_cpu)
        bufs.last_len_host[:real].copy_(batch.last_len_cpu)
        bufs.last_len_host[real:bs] = 1
        bufs.indptr[: bs + 1].copy_(bufs.indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            bufs.indptr_host[: bs + 1],
            bufs.indices_host[:nnz],
            bufs.last_len_host[:bs],
            **self._common,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        bufs = self.graph_bufs
        bufs.indptr_host[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        bufs.indices_host[:bs].zero_()
        bufs.last_len_host[:bs].fill_(1)
        self.graph_wrappers[bs].plan(
            bufs.indptr_host[: bs + 1], bufs.indices_host[:bs], bufs.last_len_host[:bs], **self._common
        )

    def snapshot_plan_state(self) -> Dict[str, Any]:
        """What the recorder needs to reproduce this step's kernels."""
        return {
            "prefill_plan": self.prefill._plan_info,  # expect: FC103
            "decode_backend": getattr(self.eager_decode, "_backend", "fa2"),  # expect: FC103
            "deterministic": self.cfg.deterministic,
        }

    # ---- attention --------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        if self.cfg.deterministic:
            return self.det_decode.run(q, kv)  # expect: FC108
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.eager_decode
        return w.run(q, kv)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv)
