"""MLA attention: absorbed decode on BatchMLAPagedAttentionWrapper, eager ragged prefill."""

import logging
from typing import Callable, Dict, List

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla
from flashinfer.mla import BatchMLAPagedAttentionWrapper

from mlaserve import MLAConfig, WsBytes
from mla_run.metadata import MLADecodeMeta, MLAPrefillMeta

logger = logging.getLogger(__name__)

_COMPAT_BUFS = ("_kv_indptr_buf", "_kv_len_arr_buf")


def make_decode_fn(wrapper: BatchMLAPagedAttentionWrapper) -> Callable[..., torch.Tensor]:
    def run(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor) -> torch.Tensor:
        return wrapper.run(q_nope, q_pe, ckv, kpe)  # expect: FC108
    return run


class MLAAttention:
    def __init__(self, cfg: MLAConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._use_cuda_graph = cfg.use_graphs  # ok: FC103
        self.ws: Dict[str, torch.Tensor] = {
            "prefill": torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device),  # ok: FC105
            "eager": torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device),  # ok: FC106
        }
        self.ws["trtllm"] = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.ws["graph"] = torch.zeros(WsBytes.GRAPH, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill = BatchPrefillWithRaggedKVCacheWrapper(self.ws["prefill"], "NHD")
        self.eager_mla = BatchMLAPagedAttentionWrapper(self.ws["eager"])
        self._eager_fn = make_decode_fn(self.eager_mla)
        self.graph_mla: Dict[int, BatchMLAPagedAttentionWrapper] = {}
        self.kv_pool_ckv: List[torch.Tensor] = []
        self.kv_pool_kpe: List[torch.Tensor] = []
        self.init_buffers()

    def bind_pool(self, ckv: List[torch.Tensor], kpe: List[torch.Tensor]) -> None:
        self.kv_pool_ckv = ckv
        self.kv_pool_kpe = kpe

    def init_buffers(self) -> None:
        cfg = self.cfg
        max_bs = cfg.max_batch_size
        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.empty(max_bs * cfg.max_pages_per_req(), dtype=torch.int32, device=self.device)
        self.kv_indices.zero_()  # ok: FC104
        self.kv_len_arr = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_bufs = {"kv_indptr": self.kv_indptr, "kv_indices": self.kv_indices, "kv_len_arr": self.kv_len_arr}
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def init_graph_wrappers(self) -> None:
        for bs in self.cfg.graph_buckets:
            self.graph_mla[bs] = BatchMLAPagedAttentionWrapper(
                self.ws["graph"], use_cuda_graph=True,
                qo_indptr=self.qo_indptr[: bs + 1],
                kv_indptr=self.kv_indptr[: bs + 1],
                kv_indices=self.kv_indices,
                kv_len_arr=self.kv_len_arr[:bs],
            )
        for w in self.graph_mla.values():
            for attr in _COMPAT_BUFS:
                if not hasattr(w, attr):  # expect: FC103
                    logger.warning("FlashInfer MLA wrapper has no %s; bound buffers unchecked", attr)

    def _plan_mla(self, w: BatchMLAPagedAttentionWrapper, qo, kv_indptr, kv_indices, kv_lens) -> None:
        c = self.cfg
        w.plan(qo, kv_indptr, kv_indices, kv_lens, c.num_heads, c.kv_lora_rank, c.qk_rope_head_dim,  # ok: FC102
               c.page_size, False, c.softmax_scale, torch.bfloat16, torch.bfloat16)

    def plan_eager(self, meta: MLADecodeMeta) -> None:
        c = self.cfg
        self.eager_mla.plan(  # expect: FC102
            meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.kv_lens,
            c.num_heads, c.kv_lora_rank, c.qk_rope_head_dim, c.page_size, False, c.softmax_scale,
            torch.bfloat16, torch.bfloat16,
        )

    def update_decode_metadata(self, bs: int, meta: MLADecodeMeta) -> bool:
        """Fills the bucket's bound buffers and plans; returns whether the trtllm-gen path is needed."""
        real = meta.batch_size
        if meta.kv_lens.max() > self.cfg.trtllm_threshold:  # expect: FC101
            return True
        longest = int(meta.kv_lens_cpu.max())  # ok: FC101
        self.kv_indptr_cpu[: real + 1].copy_(meta.kv_indptr_cpu)
        self.kv_indptr_cpu[real + 1 : bs + 1] = self.kv_indptr_cpu[real]
        self.kv_len_cpu[:real].copy_(meta.kv_lens_cpu)
        self.kv_len_cpu[real:bs].fill_(0)
        total = int(self.kv_indptr_cpu[real])
        self.kv_indices[:total].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_len_arr[:bs].copy_(self.kv_len_cpu[:bs], non_blocking=True)
        self.kv_indptr[: real + 1].copy_(self.kv_indptr_cpu[: real + 1], non_blocking=True)
        self._plan_mla(self.graph_mla[bs], self._host_qo_indptr(bs), self.kv_indptr_cpu[: bs + 1],
                       self.kv_indices, self.kv_len_cpu[:bs])
        self.graph_bufs["kv_indptr"][real + 1 : bs + 1] = total  # expect: FC104
        logger.debug("bucket %d planned, longest %d", bs, longest)
        return False

    def _host_qo_indptr(self, bs: int) -> torch.Tensor:
        return torch.arange(bs + 1, dtype=torch.int32)

    # ---- forward ---------------------------------------------------------------------------
    def forward_decode(self, layer: int, q_nope: torch.Tensor, q_pe: torch.Tensor, bs: int) -> torch.Tensor:
        ckv, kpe = self.kv_pool_ckv[layer], self.kv_pool_kpe[layer]
        if bs not in self.graph_mla:
            return self._eager_fn(q_nope, q_pe, ckv, kpe)
        return self.graph_mla[bs].run(q_nope, q_pe, ckv, kpe)  # ok: FC108

    def forward_decode_trtllm(self, layer: int, q: torch.Tensor, meta: MLADecodeMeta) -> torch.Tensor:
        c = self.cfg
        kv = torch.cat([self.kv_pool_ckv[layer], self.kv_pool_kpe[layer]], dim=-1).unsqueeze(1)
        return trtllm_batch_decode_with_kv_cache_mla(
            q, kv, self.ws["trtllm"], c.qk_nope_head_dim, c.kv_lora_rank, c.qk_rope_head_dim,
            meta.block_tables, meta.kv_lens, c.max_context_len, bmm1_scale=c.softmax_scale,
        )

    def plan_prefill(self, meta: MLAPrefillMeta) -> None:
        c = self.cfg
        self.prefill.plan(meta.cu_seqlens_cpu, meta.cu_seqlens_kv_cpu, c.num_heads, c.num_heads,
                          c.qk_nope_head_dim + c.qk_rope_head_dim, head_dim_vo=c.v_head_dim, causal=True,
                          sm_scale=c.softmax_scale)

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, k, v)
