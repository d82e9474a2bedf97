"""FlashInfer attention for the LoRA engine: eager, long-context and graph-mode decode."""

import functools
import logging
from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from loraswap.config import LoRAServeConfig
from lora_rt.batch import DecodeStepMeta, PrefillStepMeta
from lora_rt.workspaces import make_fa2_workspace, make_trtllm_workspace

logger = logging.getLogger(__name__)


class LoRAAttentionBackend:
    GRAPH_WS_BYTES = 256 * 1024 * 1024

    def __init__(self, cfg: LoRAServeConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self.graph_mode = True
        self.decode_workspace = make_fa2_workspace(cfg.decode_workspace_bytes(), device)
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.graph_workspace = torch.zeros(self.GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm_workspace = make_trtllm_workspace(cfg.decode_workspace_bytes(), device)

        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, use_tensor_cores=True)
        self.split_kv_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self._plan_eager = functools.partial(
            self.eager_decode.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.float16,
        )

        max_bs = cfg.max_batch_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req(), dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_graph_wrappers(self) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in self.cfg.graph_buckets:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def warmup_kernels(self) -> None:
        for bs, w in self.graph_decode.items():
            if getattr(w, "_cached_module", None) is None:  # expect: FC103
                logger.info("bucket %d: decode module not compiled yet", bs)

    # ---- per step -------------------------------------------------------------------------
    def init_forward_metadata(self, meta: DecodeStepMeta) -> None:
        bs = meta.batch_size
        if meta.split_kv:
            last_page_len_gpu = (meta.seq_lens - 1) % self.cfg.page_size + 1
            self.split_kv_decode.plan(  # expect: FC102
                meta.kv_indptr_host[: bs + 1],
                meta.kv_indices,
                last_page_len_gpu,
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
            )
        else:
            self._plan_eager(meta.kv_indptr_host[: bs + 1], meta.kv_indices, meta.last_page_len_host[:bs])  # ok: FC102

    def plan_prefill(self, meta: PrefillStepMeta) -> None:
        self.prefill.plan(  # expect: FC102
            meta.qo_indptr,
            meta.kv_indptr_host,
            meta.kv_indices,
            meta.last_page_len_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeStepMeta) -> None:
        real = meta.batch_size
        self.kv_indptr_cpu[: real + 1].copy_(meta.kv_indptr_host[: real + 1])
        self.kv_indptr_cpu[real + 1 : bs + 1] = self.kv_indptr_cpu[real]
        self.kv_last_page_len_cpu[:real].copy_(meta.last_page_len_host[:real])
        n = int(self.kv_indptr_cpu[real])  # ok: FC101
        self.kv_indices[:n].copy_(meta.kv_indices[:n], non_blocking=True)  # ok: FC104
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        w = self.graph_decode[bs]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.float16,
        )
        self.kv_last_page_len[real:bs].fill_(1)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeStepMeta) -> torch.Tensor:
        if meta.use_long_path:
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.trtllm_workspace, meta.block_tables, meta.seq_lens,
                self.cfg.max_context_len, bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0,
            )
        if meta.split_kv:
            return self.split_kv_decode.run(q, kv_cache)  # expect: FC108
        w = self.graph_decode[meta.batch_size] if self.graph_mode and meta.batch_size in self.graph_decode else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)
