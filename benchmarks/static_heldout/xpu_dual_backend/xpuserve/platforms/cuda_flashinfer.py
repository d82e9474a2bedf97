"""CUDA: FlashInfer paged attention, eager for mixed batches and graph-mode wrappers for uniform decode."""
from dataclasses import dataclass

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from xpuserve.platforms import register_backend
from xpuserve.platforms.base import AttentionBackend, StepInput


def _default_prefill_workspace_bytes() -> int:
    return 256 * 1024 * 1024


@dataclass
class FlashInferStepMetadata:
    max_seq_len: int
    max_query_len: int
    num_reqs: int


class CudaMetadataBuilder:
    def __init__(self, backend: "CudaFlashInferBackend"):
        self.backend = backend

    def build(self, batch: StepInput, query_start_loc: torch.Tensor) -> FlashInferStepMetadata:
        b = self.backend
        n, ps = batch.num_reqs, b.page_size
        max_seq_len = batch.seq_lens.max().item()  # expect: FC101
        max_q = max(batch.query_lens_list)  # ok: FC101
        num_blocks = (batch.seq_lens_cpu + ps - 1) // ps
        indptr = b.kv_indptr_cpu.numpy()
        indptr[0] = 0
        np.cumsum(num_blocks, out=indptr[1 : n + 1])
        flat = np.concatenate([batch.block_table_cpu[i, : num_blocks[i]] for i in range(n)])
        indices_gpu = torch.from_numpy(flat).to(b.device, non_blocking=True)
        b.kv_last_page_len_cpu[:n] = torch.from_numpy((batch.seq_lens_cpu - 1) % ps + 1)
        if max_q == 1 and not b.prefill_kernel_for_decode:
            b.decode_wrapper.plan(  # ok: FC102
                b.kv_indptr_cpu[: n + 1], indices_gpu, b.kv_last_page_len_cpu[:n], *b.heads, ps, data_type=b.dtype
            )
        else:
            b.prefill_wrapper.plan(  # expect: FC102
                query_start_loc, b.kv_indptr_cpu[: n + 1], indices_gpu, b.kv_last_page_len_cpu[:n], *b.heads, ps,
                causal=True,
            )
        return FlashInferStepMetadata(max_seq_len, max_q, n)


@register_backend("cuda")
class CudaFlashInferBackend(AttentionBackend):
    name = "cuda"

    def __init__(self, cfg, device):
        self.cfg = cfg
        self.device = device
        self.dtype = torch.bfloat16
        self.page_size = cfg.page_size
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)
        self._kv_layout = "NHD"
        # large GQA groups decode faster through the prefill (tensor-core) kernel
        self.prefill_kernel_for_decode = cfg.num_qo_heads // cfg.num_kv_heads >= 8
        self.decode_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        split_bytes = cfg.max_num_seqs * cfg.num_qo_heads * cfg.head_dim * 4 * 16 + (32 << 20)
        u8 = torch.uint8
        self.decode_workspace = torch.empty(split_bytes, dtype=u8, device=device)  # expect: FC105
        self.prefill_workspace = torch.zeros(_default_prefill_workspace_bytes(), dtype=u8, device=device)  # expect: FC106
        self.graph_workspace = self._zeroed_workspace(split_bytes)
        self._float_workspace_buffer = self.decode_workspace

        max_blocks = cfg.max_num_seqs * (cfg.max_model_len // cfg.page_size)
        self.max_blocks = max_blocks
        self.kv_indptr = torch.zeros(cfg.max_num_seqs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_blocks, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(cfg.max_num_seqs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(cfg.max_num_seqs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(cfg.max_num_seqs, dtype=torch.int32, pin_memory=True)
        self.block_ids_staging = torch.zeros(max_blocks, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, device=device)
        self.copy_stream = torch.cuda.Stream()
        self.query_start_loc = None
        self.seq_lens_list_cpu = None
        self.kv_caches = [
            torch.zeros((cfg.num_blocks, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim), dtype=self.dtype, device=device)
            for _ in range(cfg.num_layers)
        ]

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", backend=self.decode_backend)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.tc_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.graph_wrappers = {}
        self.builder = CudaMetadataBuilder(self)
        self.metadata = None

    def _zeroed_workspace(self, nbytes: int) -> torch.Tensor:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        ws.zero_()
        return ws

    def init_graph_wrappers(self, batch_sizes):
        for bs in batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True, backend=self.decode_backend,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def workspace_report(self) -> dict:
        return {
            "decode": getattr(self.decode_wrapper, "_float_workspace_buffer").numel(),  # expect: FC103
            "shared": self._float_workspace_buffer.numel(),  # ok: FC103
        }

    def begin_step(self, batch: StepInput) -> None:
        n = batch.num_reqs
        self.query_start_loc = torch.zeros(n + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        torch.cumsum(batch.query_lens, 0, dtype=torch.int32, out=self.query_start_loc[1:])
        self.seq_lens_list_cpu = torch.tensor(batch.seq_lens_cpu, dtype=torch.int32)  # ok: FC107
        self.metadata = self.builder.build(batch, self.query_start_loc)

    def _plan_graph(self, bs: int, total: int):
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices[:total], self.kv_last_page_len_cpu[:bs],
            *self.heads, self.page_size, data_type=self.dtype,
        )
        if self.prefill_kernel_for_decode:
            self.tc_prefill_wrapper.plan(
                torch.arange(bs + 1, dtype=torch.int32), self.kv_indptr_cpu[: bs + 1], self.kv_indices[:total],
                self.kv_last_page_len_cpu[:bs], *self.heads, self.page_size, causal=True,
            )

    def prepare_graph_inputs(self, batch: StepInput, bs: int):
        self.copy_stream.synchronize()  # expect: FC101
        n, ps = batch.num_reqs, self.page_size
        indptr = self.kv_indptr_cpu.numpy()
        indptr[0] = 0
        np.cumsum((batch.seq_lens_cpu + ps - 1) // ps, out=indptr[1 : n + 1])
        indptr[n + 1 : bs + 1] = indptr[n]
        total = int(indptr[n])
        self.kv_last_page_len_cpu[:n] = torch.from_numpy((batch.seq_lens_cpu - 1) % ps + 1)
        self.kv_indices[:total].copy_(self.block_ids_staging[:total], non_blocking=True)  # ok: FC104
        self._plan_graph(bs, total)
        self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)  # ok: FC104

    def forward_graph_decode(self, q: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        kv = self.kv_caches[layer_id]
        if self.prefill_kernel_for_decode:
            return self.tc_prefill_wrapper.run(q, kv)  # expect: FC108
        return self.graph_wrappers[bs].run(q, kv)  # ok: FC108

    def forward_eager(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        kv = self.kv_caches[layer_id]
        if self.metadata.max_query_len == 1 and not self.prefill_kernel_for_decode:
            return self.decode_wrapper.run(q, kv)
        return self.prefill_wrapper.run(q, kv)
