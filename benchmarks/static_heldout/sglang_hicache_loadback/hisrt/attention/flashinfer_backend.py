"""FlashInfer attention backend with hierarchical-cache load-back.

Extend batches plan a ragged wrapper (no cached prefix) or a paged wrapper (prefix in the pool). When part of a
prefix was loaded back from host memory, the metadata build also launches the layer-wise copies, so that the
planning on the host overlaps the first layer's transfer; the forward then waits per layer in
``MHATokenToKVPool.get_kv_buffer``. Decode batches use eager wrappers, or one graph-mode wrapper per captured
batch size bound to the shared ``cuda_graph_*`` buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional

import torch
import triton
import triton.language as tl
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from hisrt.global_config import global_config

if TYPE_CHECKING:
    from hisrt.mem_cache.hicache import HiCacheController
    from hisrt.model_executor.model_runner import AttnLayerSpec, ForwardBatch, ModelRunner


@triton.jit
def fill_page_indices_kernel(
    table_ptr, rows_ptr, lens_ptr, indptr_ptr, out_ptr, table_stride: tl.constexpr, BLOCK: tl.constexpr = 512,
):
    # one program per request: copy its token slots from the req_to_token table into the flat index list
    req = tl.program_id(0)
    row = tl.load(rows_ptr + req)
    length = tl.load(lens_ptr + req).to(tl.int32)
    dst = tl.load(indptr_ptr + req)
    for start in range(0, length, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        keep = offs < length
        slots = tl.load(table_ptr + row * table_stride + offs, mask=keep)
        tl.store(out_ptr + dst + offs, slots, mask=keep)


@dataclass
class DecodeMetadata:
    decode_wrappers: List[BatchDecodeWithPagedKVCacheWrapper]


@dataclass
class PrefillMetadata:
    prefill_wrappers: List[BatchPrefillWithPagedKVCacheWrapper]
    use_ragged: bool


class FlashInferAttnBackend:
    def __init__(self, model_runner: "ModelRunner") -> None:
        cfg = model_runner.model_config
        args = model_runner.server_args
        self.device = model_runner.device
        self.num_qo_heads = cfg.num_attention_heads // model_runner.tp_size
        self.num_kv_heads = cfg.num_key_value_heads // model_runner.tp_size
        self.head_dim = cfg.head_dim
        self.q_data_type = model_runner.dtype
        self.kv_cache_dtype = model_runner.kv_cache_dtype
        self.logit_cap = cfg.attn_logit_softcapping or 0.0
        self.req_to_token = model_runner.req_to_token
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.max_context_len = model_runner.max_context_len
        self._kv_layout = "NHD"
        self.decode_use_tensor_cores = self.num_qo_heads // self.num_kv_heads >= 4
        major, _ = torch.cuda.get_device_capability()
        self.decode_backend = "trtllm-gen" if major >= 10 else "fa2"

        max_bs = args.max_running_requests
        decode_ws = self._decode_ws_bytes(max_bs, self.num_qo_heads, self.head_dim)
        self.decode_workspace = torch.empty(decode_ws, dtype=torch.uint8, device=self.device)  # expect: FC105
        prefill_ws = args.chunked_prefill_size * self.num_qo_heads * (self.head_dim + 1) * 8 + max_bs * 4096
        self.prefill_workspace = torch.empty(prefill_ws, dtype=torch.uint8, device=self.device)  # ok: FC105

        self.decode_wrappers = [
            BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace, self._kv_layout, use_tensor_cores=self.decode_use_tensor_cores, backend=self.decode_backend
            )
        ]
        # layers with attention logit soft-capping are planned with the cap on their own wrapper
        self.softcap_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, use_tensor_cores=self.decode_use_tensor_cores
        )
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(
            self.prefill_workspace, self._kv_layout, backend="fa2"
        )
        self.prefill_wrappers_paged = [
            BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        ]

        # eager index buffers (device for the index kernel, pinned mirrors for plan())
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.forward_metadata = None
        self.decode_cuda_graph_metadata: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.hicache_ctrl: Optional["HiCacheController"] = None

    @staticmethod
    def _decode_ws_bytes(max_bs: int, num_heads: int, head_dim: int) -> int:
        # split-k partial outputs and LSEs for up to 32 KV chunks per request, plus the semaphore area
        return max_bs * num_heads * 32 * (head_dim + 1) * 4 + max_bs * num_heads * 256

    # ------------------------------------------------------------------ per step

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        if forward_batch.forward_mode.is_decode():
            fb = forward_batch
            self._update_decode(fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu, fb.seq_lens_sum)
            self.forward_metadata = DecodeMetadata(self.decode_wrappers)
            return
        extend_no_prefix = not bool(forward_batch.extend_prefix_lens.any())  # expect: FC101
        self._update_extend(forward_batch, extend_no_prefix)
        self.forward_metadata = PrefillMetadata(self.prefill_wrappers_paged, extend_no_prefix)
        has_host_hit = any(forward_batch.host_hit_lens_cpu)  # ok: FC101
        if has_host_hit and forward_batch.hicache_load is not None and self.hicache_ctrl is not None:
            self.hicache_ctrl.start_loading(forward_batch.hicache_load)

    def _update_decode(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, seq_lens_sum: int,
    ) -> None:
        bs = seq_lens.shape[0]
        kv_indptr = self.kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)
        kv_indices = torch.empty(seq_lens_sum + 256, dtype=torch.int32, device=self.device)
        stride = self.req_to_token.shape[1]
        fill_page_indices_kernel[(bs,)](self.req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, stride)
        kv_indptr_host = self.kv_indptr_host[: bs + 1]
        kv_indptr_host[1:] = torch.cumsum(seq_lens_cpu, dim=0)
        heads = (self.num_qo_heads, self.num_kv_heads, self.head_dim, 1)
        dtypes = dict(data_type=self.kv_cache_dtype, q_data_type=self.q_data_type)
        self.decode_wrappers[0].begin_forward(kv_indptr_host, kv_indices, self.kv_last_page_len_host[:bs], *heads, **dtypes)  # ok: FC102
        if self.logit_cap > 0:
            self.softcap_decode_wrapper.begin_forward(
                kv_indptr_host, kv_indices, self.kv_last_page_len_host[:bs], *heads, logits_soft_cap=self.logit_cap, **dtypes
            )

    def _update_extend(self, forward_batch: "ForwardBatch", extend_no_prefix: bool) -> None:
        bs = forward_batch.batch_size
        kv_indptr = self.kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(forward_batch.seq_lens, dim=0)
        kv_indices = torch.empty(forward_batch.seq_lens_sum + 256, dtype=torch.int32, device=self.device)
        stride = self.req_to_token.shape[1]
        fill_page_indices_kernel[(bs,)](
            self.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, kv_indptr, kv_indices, stride
        )
        qo_indptr = self.qo_indptr[: bs + 1]
        qo_indptr[1:] = torch.cumsum(forward_batch.seq_lens - forward_batch.extend_prefix_lens, dim=0)

        if extend_no_prefix:
            qo_host = torch.zeros(bs + 1, dtype=torch.int32)
            qo_host[1:] = torch.cumsum(torch.tensor(forward_batch.extend_seq_lens_cpu, dtype=torch.int32), dim=0)
            self.prefill_wrapper_ragged.begin_forward(  # ok: FC102
                qo_host, qo_host, self.num_qo_heads, self.num_kv_heads, self.head_dim, causal=True, q_data_type=self.q_data_type
            )
        self.prefill_wrappers_paged[0].begin_forward(  # expect: FC102
            qo_indptr, kv_indptr, kv_indices, self.kv_last_page_len[:bs], self.num_qo_heads, self.num_kv_heads,
            self.head_dim, 1, causal=True, q_data_type=self.q_data_type,
        )

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        # zeroed by the graph runner once the pool's padding slot is reserved
        self.cuda_graph_kv_indices = torch.empty(max_bs * self.max_context_len, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_last_page_len.fill_(1)  # ok: FC104
        self.cuda_graph_kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cuda_graph_kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.cuda_graph_workspace = torch.zeros(global_config.flashinfer_workspace_size, dtype=torch.uint8, device=self.device)  # expect: FC106

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor,
    ) -> None:
        decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.cuda_graph_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=self.decode_use_tensor_cores,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_kv_last_page_len[:bs],
            backend=self.decode_backend,
        )
        kv_indptr_host = self.cuda_graph_kv_indptr_host[: bs + 1]
        kv_indptr_host[1:] = torch.cumsum(seq_lens_cpu[:bs], dim=0)
        # plan over exactly the pages of the dummy batch
        indices = self.cuda_graph_kv_indices[: seq_lens.sum()]  # expect: FC101
        decode_wrapper.begin_forward(
            kv_indptr_host, indices, self.cuda_graph_kv_last_page_len_host[:bs], self.num_qo_heads, self.num_kv_heads,
            self.head_dim, 1, data_type=self.kv_cache_dtype, q_data_type=self.q_data_type,
        )
        self.decode_cuda_graph_metadata[bs] = decode_wrapper
        self.forward_metadata = DecodeMetadata([decode_wrapper])

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
        seq_lens_cpu: torch.Tensor,
    ) -> None:
        wrapper = self.decode_cuda_graph_metadata[bs]
        kv_indptr_host = self.cuda_graph_kv_indptr_host[: bs + 1]
        kv_indptr_host[1:] = torch.cumsum(seq_lens_cpu[:bs], dim=0)
        self.cuda_graph_kv_indptr[: bs + 1].copy_(kv_indptr_host, non_blocking=True)
        stride = self.req_to_token.shape[1]
        fill_page_indices_kernel[(bs,)](self.req_to_token, req_pool_indices, seq_lens, self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices, stride)  # ok: FC104
        wrapper.begin_forward(  # ok: FC102
            kv_indptr_host, self.cuda_graph_kv_indices, self.cuda_graph_kv_last_page_len_host[:bs], self.num_qo_heads,
            self.num_kv_heads, self.head_dim, 1, data_type=self.kv_cache_dtype, q_data_type=self.q_data_type,
        )
        # padded rows (raw_bs..bs) were given the fill length by the runner: make them attend to nothing
        self.cuda_graph_kv_indptr[raw_bs + 1 : bs + 1] = self.cuda_graph_kv_indptr[raw_bs]  # expect: FC104
        self.forward_metadata = DecodeMetadata([wrapper])

    # ------------------------------------------------------------------ forward

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: "AttnLayerSpec", forward_batch: "ForwardBatch"
    ) -> torch.Tensor:
        self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        kv = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        q = q.view(-1, layer.num_heads, layer.head_dim)
        if layer.logit_cap > 0:
            o = self.softcap_decode_wrapper.run(q, kv)  # expect: FC108
        else:
            o = self.forward_metadata.decode_wrappers[0].run(q, kv)  # ok: FC108
        return o.view(-1, layer.num_heads * layer.head_dim)

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: "AttnLayerSpec", forward_batch: "ForwardBatch"
    ) -> torch.Tensor:
        self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        q = q.view(-1, layer.num_heads, layer.head_dim)
        if self.forward_metadata.use_ragged:
            o = self.prefill_wrapper_ragged.run(q, k.view(-1, self.num_kv_heads, layer.head_dim), v.view(-1, self.num_kv_heads, layer.head_dim))
        else:
            kv = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
            o = self.forward_metadata.prefill_wrappers[0].run(q, kv)
        return o.view(-1, layer.num_heads * layer.head_dim)

    # ------------------------------------------------------------------ server info

    def workspace_usage_bytes(self) -> Dict[str, int]:
        """Reported by the server's /get_server_info next to the KV pool sizes."""
        usage: Dict[str, int] = {}
        named = (("decode", self.decode_wrappers[0]), ("prefill", self.prefill_wrappers_paged[0]))
        for name, w in named:
            usage[name] = w._int_workspace_buffer.numel()  # expect: FC103
        return usage
