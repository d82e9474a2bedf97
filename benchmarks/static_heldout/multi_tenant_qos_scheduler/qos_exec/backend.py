"""FlashInfer decode/prefill for the QoS engine; graph-mode decode per batch bucket."""

import itertools
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from qos_exec.metadata import QoSStepMeta, ResumeRows
from qos_exec.workspaces import decode_workspace, prefill_workspace


@dataclass
class AttnShape:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch_size: int = 256
    max_pages: int = 1 << 20
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class QoSAttentionBackend:
    def __init__(self, shape: AttnShape, device: torch.device):
        self.shape = shape
        self.device = device
        self._sm_scale = shape.head_dim ** -0.5  # ok: FC103
        self.decode_ws = decode_workspace(shape.max_batch_size, shape.num_qo_heads, shape.head_dim, device)
        self.graph_ws = decode_workspace(shape.max_batch_size, shape.num_qo_heads, shape.head_dim, device)
        self.prefill_ws = prefill_workspace(device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", use_tensor_cores=True)
        self._decode_plan = self.decode_wrapper.plan
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        self.resume_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        max_bs = shape.max_batch_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(shape.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.row_priority = torch.zeros(max_bs, dtype=torch.float32, device=device)
        self.kv_indptr_scratch: Optional[torch.Tensor] = None
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def _heads(self) -> dict:
        s = self.shape
        return dict(num_qo_heads=s.num_qo_heads, num_kv_heads=s.num_kv_heads, page_size=s.page_size)

    def init_graph_wrappers(self) -> None:
        self.kv_indices.zero_()  # ok: FC104
        for bs in self.shape.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def reset_after_oom(self) -> None:
        for w in itertools.chain(self.graph_wrappers.values(), [self.decode_wrapper]):
            w._int_workspace_buffer.zero_()  # expect: FC103

    # ---- per step -------------------------------------------------------------------------
    def init_forward_metadata(self, meta: QoSStepMeta) -> None:
        s = self.shape
        nd, npf = meta.num_decode, meta.num_prefill
        if nd:
            self._decode_plan(meta.kv_indptr_cpu[: nd + 1], meta.kv_indices, meta.last_page_len_cpu[:nd],  # ok: FC102
                              head_dim=s.head_dim, **self._heads())
        if npf:
            self.prefill_wrapper.plan(**dict(  # expect: FC102
                qo_indptr=meta.prefill_qo_indptr_cpu,
                paged_kv_indptr=meta.prefill_kv_indptr,
                paged_kv_indices=meta.kv_indices,
                paged_kv_last_page_len=meta.prefill_last_page_len_cpu,
                num_qo_heads=s.num_qo_heads,
                num_kv_heads=s.num_kv_heads,
                head_dim_qk=s.head_dim,
                page_size=s.page_size,
                causal=True,
            ))
        bs = meta.batch_size
        if self.row_priority.numel() < bs:
            self.row_priority = torch.zeros(2 * bs, dtype=torch.float32, device=self.device)  # expect: FC107
        self.row_priority[:bs].copy_(meta.priority, non_blocking=True)

    def plan_resume(self, rows: ResumeRows) -> None:
        s = self.shape
        if self.kv_indptr_scratch is None:
            self.kv_indptr_scratch = torch.zeros(s.max_batch_size + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        n = rows.count
        self.kv_indptr_scratch[: n + 1].copy_(rows.kv_indptr_cpu, non_blocking=True)
        self.resume_wrapper.plan(  # expect: FC102
            rows.qo_indptr_cpu, self.kv_indptr_scratch[: n + 1], rows.kv_indices, rows.last_page_len_cpu,
            s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, causal=True,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: QoSStepMeta) -> None:
        n = meta.num_decode
        self.kv_indptr_cpu[: n + 1].copy_(meta.kv_indptr_cpu[: n + 1])
        self.kv_indptr_cpu[n + 1 : bs + 1] = self.kv_indptr_cpu[n]
        self.kv_last_page_len_cpu[:n].copy_(meta.last_page_len_cpu[:n])
        total = int(self.kv_indptr_cpu[n])
        self.kv_indices[:total].copy_(meta.kv_indices[:total], non_blocking=True)  # ok: FC104
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs],
            self.shape.num_qo_heads, self.shape.num_kv_heads, self.shape.head_dim, self.shape.page_size,
        )

    # ---- forward ---------------------------------------------------------------------------
    def warmup_prefill(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Compile the prefill kernels before the first graph is captured."""
        return self.prefill_wrapper.run(q, kv)  # expect: FC108

    def forward_decode(self, q: torch.Tensor, kv: torch.Tensor, meta: QoSStepMeta, bs: int) -> torch.Tensor:
        if meta.graph and bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.decode_wrapper
        return w.run(q, kv)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv: torch.Tensor, resumed: bool) -> torch.Tensor:
        return (self.resume_wrapper if resumed else self.prefill_wrapper).run(q, kv)
