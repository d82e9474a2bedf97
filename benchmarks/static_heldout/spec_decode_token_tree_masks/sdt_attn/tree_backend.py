"""Tree attention on FlashInfer's paged prefill wrapper with packed custom masks: one graph-mode wrapper per
(batch bucket, tree size), an eager wrapper for larger batches, and the draft head's decode wrapper."""
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from sdt import SpecConfig, TokenTree, TreeBatch, WsSize, batch_tree_mask
from sdt_attn.masks import pack_tree_mask

Key = Tuple[int, int]
_MASK_BUFS = ("_custom_mask_buf", "_mask_indptr_buf")


class TreeAttnBackend:
    def __init__(self, cfg: SpecConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.graph_workspace = torch.zeros(WsSize.TREE, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_workspace = torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.draft_workspace = torch.zeros(cfg.draft_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.eager_workspace, "NHD", backend="fa2")
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.draft_workspace, "NHD")
        self.tree_wrappers: Dict[Key, BatchPrefillWithPagedKVCacheWrapper] = {}
        self.mask_stage = torch.zeros(cfg.mask_bytes() * 8, dtype=torch.bool, device=device)
        self.init_tree_buffers()

    def init_tree_buffers(self) -> None:
        cfg, dev = self.cfg, self.device
        max_bs = max(cfg.batch_buckets)
        self.qo_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.pages_per_request, dtype=torch.int32, device=dev)
        self.last_page_buf = torch.empty(max_bs, dtype=torch.int32, device=dev)
        self.mask_buf = torch.zeros(cfg.mask_bytes(), dtype=torch.uint8, device=dev)
        self.mask_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        for bs in cfg.batch_buckets:
            for n in cfg.tree_sizes:
                self.tree_wrappers[(bs, n)] = BatchPrefillWithPagedKVCacheWrapper(
                    self.graph_workspace, "NHD", use_cuda_graph=True,
                    qo_indptr_buf=self.qo_indptr_buf[: bs + 1],
                    paged_kv_indptr_buf=self.kv_indptr_buf[: bs + 1],
                    paged_kv_indices_buf=self.kv_indices_buf,
                    paged_kv_last_page_len_buf=self.last_page_buf[:bs],
                    custom_mask_buf=self.mask_buf,
                    mask_indptr_buf=self.mask_indptr_buf[: bs + 1],
                    backend="fa2",
                )
        self.last_page_buf.fill_(1)  # ok: FC104

    def check_mask_bindings(self) -> None:
        for name in _MASK_BUFS:
            for key, w in self.tree_wrappers.items():
                buf = getattr(w, name)  # expect: FC103
                if buf.device != self.device:
                    raise RuntimeError(f"{key}: {name} lives on {buf.device}")

    # ---- per step -----------------------------------------------------------------------------
    def prepare_tree_metadata(self, batch: TreeBatch, tree: TokenTree, key: Optional[Key]) -> None:
        cfg = self.cfg
        n = tree.size
        seg_np = (n * (batch.seq_lens_np + n)).astype(np.int32)
        mask_np = batch_tree_mask(tree, batch.seq_lens_np)
        self.mask_stage[: mask_np.size].copy_(torch.from_numpy(mask_np), non_blocking=True)
        packed, _ = pack_tree_mask(self.mask_stage, torch.from_numpy(seg_np).to(self.device, non_blocking=True))
        heads = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self.draft_wrapper.plan(
            batch.kv_indptr_host, batch.kv_indices, batch.last_page_host, *heads, q_data_type=cfg.dtype
        )
        if key is None:
            self.eager_wrapper.plan(  # expect: FC102
                batch.qo_indptr_gpu, batch.kv_indptr_host, batch.kv_indices, batch.last_page_host, *heads,
                packed_custom_mask=packed, q_data_type=cfg.dtype,
            )
        else:
            bucket, bs = key[0], batch.batch_size
            n_pages = int(batch.kv_indptr_host[-1])
            used_bytes = int(((seg_np + 7) // 8).sum())
            self.kv_indices_buf[:n_pages].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
            qo = torch.arange(bucket + 1, dtype=torch.int32) * n
            qo[bs + 1 :] = bs * n
            kv = torch.cat([batch.kv_indptr_host, batch.kv_indptr_host[-1:].expand(bucket - bs)])
            last = torch.cat([batch.last_page_host, torch.ones(bucket - bs, dtype=torch.int32)])
            self.tree_wrappers[key].plan(  # ok: FC102
                qo, kv, self.kv_indices_buf[:n_pages], last, *heads,
                packed_custom_mask=packed, q_data_type=cfg.dtype,
            )
            # bytes past this step's masks: clear them so padded rows see nothing
            self.mask_buf[used_bytes:].zero_()  # expect: FC104

    # ---- in the step --------------------------------------------------------------------------
    def forward_tree(self, q: torch.Tensor, kv_cache, key: Optional[Key]) -> torch.Tensor:
        w = self.eager_wrapper if key is None else self.tree_wrappers[key]
        return w.run(q, kv_cache)  # ok: FC108

    def forward_draft(self, q: torch.Tensor, kv_cache) -> torch.Tensor:
        return self.draft_wrapper.run(q, kv_cache)  # expect: FC108
