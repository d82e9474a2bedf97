"""Per-step attention metadata: vLLM's CommonAttentionMetadata in, FlashInferMetadata out.

The builder splits the batch into decodes (first) and prefills, fills the backend's pinned page-list mirrors
with numpy, uploads them to the persistent device lists, and plans the eager wrappers from the mirrors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from densefi.attention import FlashInferBackend
from densefi.config import EngineConfig
from densefi_ops.kv_pages import window_page_indices

logger = logging.getLogger(__name__)

_PREFILL_PLAN_KEYS = frozenset(
    {
        "qo_indptr",
        "paged_kv_indptr",
        "paged_kv_indices",
        "paged_kv_last_page_len",
        "num_qo_heads",
        "num_kv_heads",
        "head_dim_qk",
        "page_size",
        "causal",
        "window_left",
        "q_data_type",
    }
)


@dataclass
class CommonAttentionMetadata:
    """What the runner hands every attention builder: device tensors with host mirrors beside them."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_table: torch.Tensor
    block_table_cpu: torch.Tensor
    slot_mapping: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    num_draft_tokens: Optional[torch.Tensor] = None
    num_draft_tokens_np: Optional[np.ndarray] = None


@dataclass
class FlashInferMetadata:
    num_reqs: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_actual_tokens: int
    max_seq_len: int
    max_query_len: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    no_prefix: bool = False
    is_verify: bool = False
    use_graph: bool = False
    graph_bs: Optional[int] = None
    use_cascade: bool = False
    spec_mask: Optional[torch.Tensor] = None
    batch_arange: Optional[torch.Tensor] = None


class FlashInferMetadataBuilder:
    def __init__(self, cfg: EngineConfig, backend: FlashInferBackend, device: torch.device) -> None:
        self.cfg = cfg
        self.backend = backend
        self.device = device
        self.page_size = cfg.page_size
        self.max_num_reqs = cfg.max_num_seqs
        # the engine's own record of what each prefill wrapper was last planned for
        self._plan_info: dict[str, tuple[int, int, int]] = {}
        self._arange_gpu: Optional[torch.Tensor] = None
        self.kv_indptr_np = {g: t.numpy() for g, t in backend.kv_indptr_cpu.items()}
        self.last_page_len_np = {g: t.numpy() for g, t in backend.last_page_len_cpu.items()}

    def build(self, common: CommonAttentionMetadata, common_prefix_len: int = 0) -> FlashInferMetadata:
        assert (num_reqs := common.num_reqs) <= self.max_num_reqs, "batch larger than max_num_seqs"  # expect: FC109
        b = self.backend
        qo_cpu = common.query_start_loc_cpu[: num_reqs + 1]
        query_lens_cpu = qo_cpu[1:] - qo_cpu[:-1]
        threshold = 1 + self.cfg.num_spec_tokens
        num_decodes = next((i for i, q in enumerate(query_lens_cpu.tolist()) if q > threshold), num_reqs)
        num_decode_tokens = int(qo_cpu[num_decodes])
        num_prefills = num_reqs - num_decodes
        max_query_len = max((int(q) for q in query_lens_cpu), default=0)  # ok: FC101
        max_seq_len = max(int(s) for s in common.seq_lens[:num_reqs])  # expect: FC101

        # Page lists on the host: numpy over the pinned mirrors, then one upload per list.
        seq_lens_np = common.seq_lens_cpu[:num_reqs].numpy()
        num_pages = -(-seq_lens_np // self.page_size)
        last_np = seq_lens_np - (num_pages - 1) * self.page_size
        bt_np = common.block_table_cpu[:num_reqs].numpy()
        for g in b.full_groups:
            indptr_np = self.kv_indptr_np[g]
            indptr_np[0] = 0
            np.cumsum(num_pages, out=indptr_np[1 : num_reqs + 1])
            self.last_page_len_np[g][:num_reqs] = last_np
            if (nnz := int(indptr_np[num_reqs])) > b.kv_indices_gpu[g].numel():  # ok: FC101
                b.kv_indices_gpu[g] = torch.empty(2 * nnz, dtype=torch.int32, device=self.device)  # expect: FC107
                b.kv_indices_cpu[g] = torch.empty(2 * nnz, dtype=torch.int32, pin_memory=True)  # ok: FC107
            if nnz:
                b.kv_indices_cpu[g][:nnz] = torch.from_numpy(
                    np.concatenate([bt_np[i, :p] for i, p in enumerate(num_pages)])
                )
            staged = (
                (b.kv_indptr_gpu[g], b.kv_indptr_cpu[g], num_reqs + 1),
                (b.kv_indices_gpu[g], b.kv_indices_cpu[g], nnz),
                (b.last_page_len_gpu[g], b.last_page_len_cpu[g], num_reqs),
            )
            for dst, src, m in staged:
                dst[:m].copy_(src[:m], non_blocking=True)  # ok: FC104

        spec_rows: list[int] = []
        if common.num_draft_tokens is not None:
            if (num_spec := int(common.num_draft_tokens.sum())) > 0:  # expect: FC101
                spec_rows = [i for i in range(num_reqs) if common.num_draft_tokens[i] > 0]  # expect: FC101
                logger.debug("verify step: %d draft tokens over %d rows", num_spec, len(spec_rows))
        use_cascade = (
            bool(b.cascade_wrappers)
            and not num_prefills
            and not spec_rows
            and common_prefix_len >= self.cfg.cascade_min_prefix
        )

        dtypes = {"q_data_type": self.cfg.dtype, "kv_data_type": self.cfg.dtype}
        if num_decodes and not spec_rows and not use_cascade:
            for g, w in b.decode_wrappers.items():
                w.plan(  # ok: FC102
                    b.kv_indptr_cpu[g][: num_decodes + 1],
                    b.kv_indices_gpu[g],
                    b.last_page_len_cpu[g][:num_decodes],
                    b.num_qo_heads,
                    b.num_kv_heads,
                    b.head_dim,
                    self.page_size,
                    **dtypes,
                )
            self._plan_windows(common, num_decodes)

        no_prefix = False
        if num_prefills:
            q_np = query_lens_cpu.numpy()
            no_prefix = bool((seq_lens_np[num_decodes:] == q_np[num_decodes:]).all())
            qo_prefill_cpu = qo_cpu[num_decodes:] - num_decode_tokens
            if no_prefix:
                kv_np = np.concatenate(([0], np.cumsum(seq_lens_np[num_decodes:]))).astype(np.int32)
                b.ragged_wrapper.plan(  # ok: FC102
                    qo_prefill_cpu,
                    torch.from_numpy(kv_np),
                    b.num_qo_heads,
                    b.num_kv_heads,
                    b.head_dim,
                    causal=True,
                    q_data_type=self.cfg.dtype,
                )
            base = {
                "qo_indptr": qo_prefill_cpu,
                "num_qo_heads": b.num_qo_heads,
                "num_kv_heads": b.num_kv_heads,
                "head_dim_qk": b.head_dim,
                "page_size": self.page_size,
                "causal": True,
                "q_data_type": self.cfg.dtype,
                "max_query_len": max_query_len,  # for the trtllm context path, not a plan argument
            }
            for g, w in b.prefill_wrappers.items():
                src = g if g in b.kv_indptr_cpu else b.full_groups[0]
                indptr = b.kv_indptr_cpu[src][num_decodes : num_reqs + 1]
                first = int(indptr[0])
                key = (num_reqs, num_decodes, int(indptr[-1]))
                if self._plan_info.get(g) == key and w._plan_info is not None:  # expect: FC103
                    continue
                paged = {
                    "paged_kv_indptr": indptr - first,
                    "paged_kv_indices": b.kv_indices_gpu[src][first:],
                    "paged_kv_last_page_len": b.last_page_len_cpu[src][num_decodes:num_reqs],
                    "window_left": b.window_left(g),
                }
                w.plan(**{k: v for k, v in (base | paged).items() if k in _PREFILL_PLAN_KEYS})  # ok: FC102
                self._plan_info[g] = key  # ok: FC103

        meta = FlashInferMetadata(
            num_reqs=num_reqs,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            num_actual_tokens=common.num_actual_tokens,
            max_seq_len=max_seq_len,
            max_query_len=max_query_len,
            seq_lens=common.seq_lens[:num_reqs],
            seq_lens_cpu=common.seq_lens_cpu[:num_reqs],
            query_start_loc=common.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=qo_cpu,
            slot_mapping=common.slot_mapping,
            block_table=common.block_table[:num_reqs],
            no_prefix=no_prefix,
            is_verify=bool(spec_rows) and not num_prefills,
            use_cascade=use_cascade,
        )
        if (arange := self._arange_gpu) is None:
            self._arange_gpu = arange = torch.arange(self.max_num_reqs + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        meta.batch_arange = arange[:num_reqs]
        if spec_rows:
            meta.spec_mask = torch.zeros(num_reqs, dtype=torch.bool, device=self.device)  # ok: FC107
            meta.spec_mask[spec_rows] = True
            if meta.is_verify:
                b.plan_verify(meta)
        if use_cascade:
            b.shared_prefix.set_prefix(common_prefix_len, self.page_size, common.num_actual_tokens)
            b.plan_cascade(meta)
        return meta

    def _plan_windows(self, common: CommonAttentionMetadata, n: int) -> None:
        """Sliding-window groups: page lists clipped to the window on the device, then planned."""
        b = self.backend
        last = b.last_page_len_cpu[b.full_groups[0]][:n]
        for (win, w), indptr, indices in zip(b.window_wrappers.items(), b.window_kv_indptr_gpu, b.window_kv_indices_gpu):
            window_page_indices(
                common.block_table[:n],
                common.seq_lens[:n],
                indptr[: n + 1],
                window=win,
                page_size=self.page_size,
                out=indices,
            )
            w.plan(  # expect: FC102
                indptr[: n + 1],
                indices,
                last,
                b.num_qo_heads,
                b.num_kv_heads,
                b.head_dim,
                self.page_size,
                window_left=win - 1,
                q_data_type=self.cfg.dtype,
                kv_data_type=self.cfg.dtype,
            )
