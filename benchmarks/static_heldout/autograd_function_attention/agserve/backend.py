"""FlashInfer attention backend: wrappers, graph-bound buffers and per-step metadata."""

from typing import Dict

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchMLAPagedAttentionWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
)

from .config import EngineConfig
from .metadata import DecodeMetadata, ExtendMetadata, ForwardBatch
from .ops.attention_fn import BuildPageIndices, PlanDecodeFn, PlanMLAFn
from .ops.registry import register_wrapper
from .workspace import (
    make_float_workspace,
    make_mla_workspace,
    make_prefill_workspace,
    make_trtllm_workspace,
    make_xqa_workspace,
)


class FlashInferBackend:
    def __init__(self, cfg: EngineConfig, req_to_page: torch.Tensor):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.req_to_page = req_to_page
        max_bs = cfg.max_batch_size

        # device buffers; the CUDA-graph wrappers are bound to views of these
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.mla_kv_len = torch.zeros(max_bs, dtype=torch.int32, device=self.device)

        # pinned host mirrors: what plan() reads
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_host = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()

        self.float_workspace = make_float_workspace(cfg, self.device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, "NHD", use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(
            make_prefill_workspace(cfg, self.device), "NHD", backend="fa2"
        )
        self.mla_wrapper = BatchMLAPagedAttentionWrapper(make_mla_workspace(self.device))
        register_wrapper("mla", self.mla_wrapper)

        self.trtllm_workspace = make_trtllm_workspace(cfg, self.device)
        self.xqa_workspace = make_xqa_workspace(cfg, self.device)

        self.graph_wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata = None
        self._plan_info = None  # (batch size, pages) of the last eager plan, for the step log

    def init_cuda_graph_state(self, buckets):
        for bs in buckets:
            self.graph_wrappers[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.float_workspace, self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs],
                "NHD", use_tensor_cores=True,
            )
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def _fill_host_mirrors(self, seq_lens_cpu: torch.Tensor, raw: int, bs: int) -> None:
        ps = self.cfg.page_size
        if bs + 1 > self.kv_indptr_host.numel():
            self.kv_indptr_host = torch.zeros(2 * (bs + 1), dtype=torch.int32, pin_memory=True)  # ok: FC107
        pages = (seq_lens_cpu[:raw] + ps - 1) // ps
        self.kv_indptr_host[1 : raw + 1] = torch.cumsum(pages, 0)
        self.kv_indptr_host[raw + 1 : bs + 1] = self.kv_indptr_host[raw]
        self.last_page_len_host[:raw] = (seq_lens_cpu[:raw] - 1) % ps + 1
        self.last_page_len_host[raw:bs] = 1

    def _decode_metadata(self, wrapper, seq_lens, req_pool_indices) -> DecodeMetadata:
        return DecodeMetadata(
            decode_wrapper=wrapper,
            seq_lens=seq_lens,
            req_to_page=self.req_to_page,
            req_pool_indices=req_pool_indices,
            kernel=self.cfg.decode_kernel,
            trtllm_workspace=self.trtllm_workspace,
            xqa_workspace=self.xqa_workspace,
            max_seq_len=self.cfg.max_context_len,
        )

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        cfg = self.cfg
        bs = batch.batch_size
        if batch.is_decode:
            self._fill_host_mirrors(batch.seq_lens_cpu, bs, bs)
            num_pages = int(self.kv_indptr_host[bs])  # ok: FC101
            if num_pages > self.kv_indices.numel():
                self.kv_indices = torch.empty(num_pages * 2, dtype=torch.int32, device=self.device)  # expect: FC107
            BuildPageIndices.apply(
                batch.seq_lens, batch.req_pool_indices, self.req_to_page, self.kv_indptr, self.kv_indices, cfg.page_size
            )
            PlanDecodeFn.apply(
                self.decode_wrapper, self.kv_indptr_host[: bs + 1], self.kv_indices[:num_pages], self.last_page_len_host[:bs], cfg
            )
            self.mla_kv_len[:bs].copy_(batch.seq_lens)
            PlanMLAFn.apply(
                self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.kv_indices[:num_pages], self.mla_kv_len[:bs], cfg, False
            )
            self._plan_info = (bs, num_pages)  # ok: FC103
            self.forward_metadata = self._decode_metadata(self.decode_wrapper, batch.seq_lens, batch.req_pool_indices)
        else:
            qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
            torch.cumsum(batch.extend_lens, 0, dtype=torch.int32, out=qo_indptr[1:])
            self.prefill_wrapper.plan(  # expect: FC102
                qo_indptr, qo_indptr, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, causal=True, q_data_type=torch.bfloat16
            )
            num_tokens = batch.input_ids.shape[0]
            self.forward_metadata = ExtendMetadata(prefill_wrapper=self.prefill_wrapper, num_tokens=num_tokens)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens: torch.Tensor, req_pool_indices: torch.Tensor):
        w = self.graph_wrappers[bs]
        if w._paged_kv_indptr_buf.data_ptr() != self.kv_indptr.data_ptr():  # expect: FC103
            raise RuntimeError(f"graph wrapper for bs={bs} is not bound to the backend's kv_indptr")
        self._fill_host_mirrors(torch.ones(bs, dtype=torch.int32), bs, bs)
        w.plan(
            self.kv_indptr_host[: bs + 1], self.kv_indices[:bs], self.last_page_len_host[:bs],
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
            q_data_type=torch.bfloat16, data_type=torch.bfloat16,
        )
        self.mla_kv_len[:bs].fill_(1)
        PlanMLAFn.apply(
            self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.kv_indices[:bs], self.mla_kv_len[:bs], self.cfg, False
        )
        self.forward_metadata = self._decode_metadata(w, seq_lens, req_pool_indices)

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw: int, seq_lens_cpu: torch.Tensor, seq_lens: torch.Tensor, req_pool_indices: torch.Tensor
    ):
        w = self.graph_wrappers[bs]
        self._fill_host_mirrors(seq_lens_cpu, raw, bs)
        num_pages = int(self.kv_indptr_host[bs])
        self.kv_last_page_len[:bs].copy_(self.last_page_len_host[:bs], non_blocking=True)  # ok: FC104
        BuildPageIndices.apply(seq_lens, req_pool_indices, self.req_to_page, self.kv_indptr, self.kv_indices, self.cfg.page_size)
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices[:num_pages], self.last_page_len_host[:bs],
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
            q_data_type=torch.bfloat16, data_type=torch.bfloat16,
        )
        self.mla_kv_len[:bs].copy_(seq_lens)
        PlanMLAFn.apply(
            self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.kv_indices[:num_pages], self.mla_kv_len[:bs], self.cfg, False
        )
        self.forward_metadata = self._decode_metadata(w, seq_lens, req_pool_indices)

    def page_table_snapshot(self, bs: int):
        """Used by the /debug/pages endpoint; never on the step path."""
        return self.kv_indices[: self.kv_indptr[bs].item()].cpu().numpy()  # ok: FC101
