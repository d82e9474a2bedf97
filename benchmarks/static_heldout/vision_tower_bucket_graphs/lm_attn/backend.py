"""FlashInfer attention of the language model: decode graphs per bucket, paged prefill."""

from dataclasses import dataclass
from typing import Dict, Optional, Union

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from lm_attn.metadata import DecodeMeta, PrefillMeta
from vlm import VLMConfig
from vt_graphs.workspace import decode_graph_workspace, prefill_workspace, trtllm_decode_workspace


@dataclass
class PlanRecord:
    batch_size: int
    num_pages: int


class VLMAttentionBackend:
    def __init__(self, cfg: VLMConfig):
        self.cfg = cfg
        self.device = cfg.device
        max_bs = cfg.decode_buckets[-1]
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_ws = decode_graph_workspace(cfg)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(cfg), "HND")
        # batches past the largest bucket run eagerly on trtllm-gen
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(
            trtllm_decode_workspace(cfg.trtllm_workspace_bytes, cfg.device.index or 0),
            "HND",
            backend="trtllm-gen",
        )
        self._eager_plan = self.eager_decode.plan
        self.eager_last_page_len_device = torch.ones(cfg.max_batch * 4, dtype=torch.int32, device=self.device)
        self.active_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self._plan_info: Optional[PlanRecord] = None

    def init_graph_wrappers(self) -> None:
        self.kv_indices_buf.zero_()  # ok: FC104
        for bs in self.cfg.decode_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )

    def _heads(self) -> dict:
        return dict(
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    def plan_decode_bucket(self, meta: DecodeMeta) -> None:
        bs = meta.padded_bs
        n = meta.kv_indices.numel()
        self.kv_indices_buf[:n].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            meta.kv_indptr_host,
            self.kv_indices_buf[:n],
            meta.last_page_len_host,
            **self._heads(),
        )
        # padding rows of the bucket read one token of page 0
        self.last_page_len_buf[meta.batch_size : bs].fill_(1)  # expect: FC104
        self.active_wrapper = w
        self._plan_info = PlanRecord(bs, n)

    def plan_decode_eager(self, meta: DecodeMeta) -> None:
        bs = meta.batch_size
        self.eager_last_page_len_device[:bs].copy_(meta.last_page_len_host, non_blocking=True)
        self._eager_plan(  # expect: FC102
            meta.kv_indptr_host,
            meta.kv_indices,
            self.eager_last_page_len_device[:bs],
            **self._heads(),
        )
        self.active_wrapper = self.eager_decode
        self._plan_info = PlanRecord(bs, meta.kv_indices.numel())

    def plan_prefill(self, meta: PrefillMeta) -> None:
        self.prefill.plan(  # expect: FC102
            qo_indptr=meta.qo_indptr,
            paged_kv_indptr=meta.kv_indptr_host,
            paged_kv_indices=meta.kv_indices,
            paged_kv_last_page_len=meta.last_page_len_host,
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim_qk=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def init_forward_metadata(self, meta: Union[PrefillMeta, DecodeMeta]) -> None:
        if isinstance(meta, PrefillMeta):
            self.plan_prefill(meta)
        elif meta.padded_bs in self.graph_wrappers:
            self.plan_decode_bucket(meta)
        else:
            self.plan_decode_eager(meta)

    def last_plan(self) -> Optional[PlanRecord]:
        return self._plan_info  # ok: FC103

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.active_wrapper.run(q, kv_cache[layer_id])  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill.run(q, kv_cache[layer_id])
