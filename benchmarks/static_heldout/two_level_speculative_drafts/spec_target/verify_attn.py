"""Target-side attention: tree verification with packed custom masks in graph-mode prefill
wrappers per bucket, and trtllm-gen decode for rows that brought no drafts."""

from typing import Dict

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from spec_kernels.page_gather import gather_page_ids_kernel
from twospec.config import SpecConfig
from twospec.tree import DraftTree
from twospec.workspace import scratch_workspace


class MaskedVerifyWrapper(BatchPrefillWithPagedKVCacheWrapper):
    """Graph-mode verify wrapper that knows how large a packed mask it can take."""

    def mask_capacity(self) -> int:
        return self._custom_mask_buf.numel()  # expect: FC103


class TreeVerifyAttention:
    def __init__(self, cfg: SpecConfig) -> None:
        self.cfg = cfg
        dev = cfg.device
        max_bs = cfg.max_batch_size
        max_pages = cfg.max_pages_per_seq()
        self.verify_workspace = torch.zeros(cfg.verify_workspace_bytes(), dtype=torch.uint8, device=dev)  # ok: FC106
        self.qo_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_bs * max_pages, dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.mask_buf = torch.zeros(cfg.mask_bytes(), dtype=torch.uint8, device=dev)
        self.mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.page_table = torch.zeros(max_bs, max_pages, dtype=torch.int32, device=dev)
        self.verify_wrappers: Dict[int, MaskedVerifyWrapper] = {}
        self.nodraft_ws = scratch_workspace(cfg.nodraft_workspace_bytes(), dev)

    def bind_verify_bucket(self, bs: int) -> MaskedVerifyWrapper:
        w = MaskedVerifyWrapper(
            self.verify_workspace,
            "NHD",
            use_cuda_graph=True,
            qo_indptr_buf=self.qo_indptr_buf[: bs + 1],
            paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
            paged_kv_indices_buf=self.kv_indices,
            paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
            custom_mask_buf=self.mask_buf,
            mask_indptr_buf=self.mask_indptr[: bs + 1],
        )
        self.verify_wrappers[bs] = w
        return w

    def prepare_verify(self, bs: int, tree: DraftTree, kv_lens_np: np.ndarray) -> None:
        """kv_lens_np: each row's target KV length including the tree tokens appended this step."""
        cfg = self.cfg
        page = cfg.page_size
        pages_np = (kv_lens_np + page - 1) // page
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        self.kv_indptr_cpu[: bs + 1].copy_(torch.from_numpy(indptr_np))
        self.kv_last_page_len_cpu[:bs].copy_(torch.from_numpy((kv_lens_np - (pages_np - 1) * page).astype(np.int32)))
        self.qo_indptr_buf[: bs + 1].copy_(tree.qo_indptr_cpu, non_blocking=True)  # ok: FC104
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)
        w = self.verify_wrappers[bs]
        if tree.packed_mask.numel() > w.mask_capacity():
            raise ValueError(f"tree mask of {tree.packed_mask.numel()} bytes exceeds the bucket's {w.mask_capacity()}")
        w.plan(  # expect: FC102
            tree.qo_indptr,
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len_cpu[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            page,
            packed_custom_mask=tree.packed_mask,
        )
        gather_page_ids_kernel[(bs,)](self.kv_indices, self.page_table, self.kv_indptr, self.page_table.stride(0), BLOCK=128)  # expect: FC104

    def forward_verify(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        return self.verify_wrappers[bs].run(q, kv_cache)

    def decode_nodraft(self, q, kv_cache, block_tables, seq_lens, max_seq_len: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q,
            kv_cache,
            self.nodraft_ws,
            block_tables,
            seq_lens,
            max_seq_len,
            bmm1_scale=self.cfg.head_dim ** -0.5,
            bmm2_scale=1.0,
        )
