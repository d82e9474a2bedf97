"""Language-model attention: a paged prefill that appends frame tokens and questions, and
trtllm-gen decode graphs per bucket of answering streams."""
from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from vstream import KVView, VideoStreamConfig

from .workspace import decode_graph_workspace, ingest_workspace


class VideoLMBackend:
    def __init__(self, cfg: VideoStreamConfig, device: torch.device):
        self.cfg = cfg
        max_bs = max(cfg.decode_buckets)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.pages_per_stream, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        ws = decode_graph_workspace(cfg)
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                ws, "HND", use_cuda_graph=True, backend="trtllm-gen",
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
            for bs in cfg.decode_buckets
        }
        self.ingest_wrapper = BatchPrefillWithPagedKVCacheWrapper(ingest_workspace(device), "HND")
        self._heads = dict(
            num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            page_size=cfg.page_size, q_data_type=torch.bfloat16,
        )

    def init_decode_buffers(self) -> None:
        self.last_page_len_buf.fill_(1)  # ok: FC104
        self.kv_indptr_buf.zero_()

    def memory_report(self) -> Dict[str, int]:
        return {f"decode_{bs}": w._int_workspace_buffer.numel() for bs, w in self.decode_wrappers.items()}  # expect: FC103

    def plan_capture(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_len_host[:bs] = 1
        self.decode_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_len_host[:bs], **self._heads
        )

    def plan_ingest(self, qo_indptr: torch.Tensor, view: KVView) -> None:
        self.ingest_wrapper.plan(  # expect: FC102
            qo_indptr, view.kv_indptr_cpu, view.indices, view.last_page_len_cpu,
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, causal=True,
        )

    def prepare_decode(self, bs: int, view: KVView) -> None:
        self.kv_indices_buf[: view.num_pages].copy_(view.indices, non_blocking=True)  # ok: FC104
        self.decode_wrappers[bs].plan(  # expect: FC102
            view.kv_indptr, self.kv_indices_buf, view.last_page_len_cpu, **self._heads
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        return self.decode_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_ingest(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.ingest_wrapper.run(q, kv_cache)
