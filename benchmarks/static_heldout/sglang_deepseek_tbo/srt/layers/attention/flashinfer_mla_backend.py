"""FlashInfer MLA backend for DeepSeek-V3: weight-absorbed decode, ragged MHA extend.

Decode multiplies q_nope by W_UK up front, so attention runs directly against the compressed
latent cache (kv_lora_rank + rope dims per token, a single shared "head") through
BatchMLAPagedAttentionWrapper.  Extend without a cached prefix runs the expanded MHA form through
a ragged prefill wrapper; extend over a prefix and speculative verify run the absorbed form
through a paged MLA wrapper.  ``--mla-decode-kernel trtllm-gen`` sends decode to the trtllm-gen
MLA kernel instead.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Union

import numpy as np
import torch
import triton
import triton.language as tl
from flashinfer import BatchMLAPagedAttentionWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from srt.layers.attention import AttentionBackend
from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from srt.model_executor.model_runner import ModelRunner

KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
assert KV_LORA_RANK + QK_ROPE_HEAD_DIM == 576  # ok: FC109


class MLADecodeKernel(enum.Enum):
    FLASHINFER = "fa2"
    TRTLLM_GEN = "trtllm-gen"


# Float workspace shared by every wrapper of the process, per decode kernel, in MiB.
_WORKSPACE_MIB: Dict[str, int] = {"fa2": 384, "trtllm-gen": 160}
_global_workspace: Optional[torch.Tensor] = None


def get_mla_workspace(kernel: MLADecodeKernel, device: torch.device) -> torch.Tensor:
    """One float workspace for every MLA and ragged wrapper (the TBO children included)."""
    global _global_workspace
    if _global_workspace is None:
        _global_workspace = torch.zeros(_WORKSPACE_MIB[kernel.value] << 20, dtype=torch.uint8, device=device)  # expect: FC106
    return _global_workspace


@triton.jit
def create_flashinfer_kv_indices_triton(
    req_to_token_ptr, req_pool_indices_ptr, page_kernel_lens_ptr, kv_indptr, kv_indices_ptr, req_to_token_stride: tl.constexpr
):
    BLOCK: tl.constexpr = 512
    pid = tl.program_id(axis=0)
    req_pool_index = tl.load(req_pool_indices_ptr + pid)
    out_offset = tl.load(kv_indptr + pid)
    kv_len = tl.load(page_kernel_lens_ptr + pid)
    for start in range(0, kv_len, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < kv_len
        tok = tl.load(req_to_token_ptr + req_pool_index * req_to_token_stride + offs, mask=mask)
        tl.store(kv_indices_ptr + out_offset + offs, tok, mask=mask)


def fast_mla_decode_plan(
    self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale,
    q_data_type, kv_data_type,
) -> None:
    """BatchMLAPagedAttentionWrapper.plan without its host/device copies.

    The replay path has already written the graph-bound kv_indptr / kv_indices / kv_len_arr on the
    device and passes their host mirrors here.
    """
    workspaces = (self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer)  # expect: FC103
    self._plan_info = self._cached_module.plan(*workspaces, qo_indptr, kv_indptr, kv_len_arr, num_heads, head_dim_ckv, causal)  # expect: FC103


@dataclass
class DecodeMetadata:
    wrapper: BatchMLAPagedAttentionWrapper


@dataclass
class PrefillMetadata:
    use_ragged: bool
    ragged: Optional[BatchPrefillWithRaggedKVCacheWrapper] = None
    paged: Optional[BatchMLAPagedAttentionWrapper] = None
    prefix_kv_indptr: Optional[torch.Tensor] = None


@dataclass
class TrtllmDecodeMetadata:
    block_kv_indices: torch.Tensor
    max_seq_len: int


ForwardMetadata = Union[DecodeMetadata, PrefillMetadata, TrtllmDecodeMetadata]


class FlashInferMLAAttnBackend(AttentionBackend):
    def __init__(self, model_runner: "ModelRunner"):
        super().__init__()
        cfg = model_runner.model_config
        args = model_runner.server_args
        self.device = model_runner.device
        self.num_local_heads = cfg.num_attention_heads // model_runner.tp_size
        self.kv_lora_rank = cfg.kv_lora_rank
        self.qk_nope_head_dim = cfg.qk_nope_head_dim
        self.qk_rope_head_dim = cfg.qk_rope_head_dim
        self.v_head_dim = cfg.v_head_dim
        self.scaling = cfg.scaling
        self.page_size = model_runner.page_size
        self.max_bs = model_runner.req_to_token_pool.size
        self.max_context_len = cfg.context_len
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.q_data_type = model_runner.dtype
        self.data_type = model_runner.kv_cache_dtype
        self.decode_kernel = MLADecodeKernel(args.mla_decode_kernel)
        self.num_draft_tokens = args.speculative_num_draft_tokens or 1
        self._kv_layout = "NHD"  # ok: FC103

        self.workspace_buffer = get_mla_workspace(self.decode_kernel, self.device)
        ragged_bytes = args.chunked_prefill_size * self.num_local_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim) * 4
        self.ragged_workspace = torch.empty(ragged_bytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        # trtllm-gen MLA keeps split-k semaphores in its own workspace
        trtllm_bytes = self.max_bs * self.num_local_heads * (self.kv_lora_rank + self.qk_rope_head_dim) * 4 * 8
        self.trtllm_workspace = torch.empty(trtllm_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105

        self.kv_indptr = torch.zeros((self.max_bs + 1,), dtype=torch.int32, device=self.device)
        self.qo_indptr = torch.arange(0, self.max_bs + 1, dtype=torch.int32, device=self.device)
        self.qo_indptr_cpu_extend = torch.zeros((self.max_bs + 1,), dtype=torch.int32, pin_memory=True)

        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self._kv_layout, backend="fa2")
        self.decode_wrapper = BatchMLAPagedAttentionWrapper(self.workspace_buffer, backend="fa2")
        self.prefill_wrapper_paged = BatchMLAPagedAttentionWrapper(self.workspace_buffer, backend="fa2")
        self.cuda_graph_decode_wrappers: Dict[int, BatchMLAPagedAttentionWrapper] = {}
        self.forward_metadata: Optional[ForwardMetadata] = None

    # ------------------------------------------------------------------ eager metadata

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        if forward_batch.forward_mode.is_decode_or_idle():
            if self.decode_kernel is MLADecodeKernel.TRTLLM_GEN:
                self.forward_metadata = self._trtllm_metadata(forward_batch)
            else:
                self._plan_decode(self.decode_wrapper, forward_batch.req_pool_indices, forward_batch.seq_lens, forward_batch.seq_lens_cpu)
                self.forward_metadata = DecodeMetadata(self.decode_wrapper)
            return
        if not any(forward_batch.extend_prefix_lens_cpu):  # ok: FC101
            self.forward_metadata = self._plan_ragged(forward_batch)
        else:
            self.forward_metadata = self._plan_prefix_extend(forward_batch)

    def _plan_decode(self, wrapper, req_pool_indices, seq_lens, seq_lens_cpu) -> None:
        bs = len(req_pool_indices)
        self.kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens, dim=0)
        kv_indptr = self.kv_indptr[: bs + 1]
        kv_indices = torch.empty(int(seq_lens_cpu.sum()), dtype=torch.int32, device=self.device)  # ok: FC101
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, self.req_to_token.shape[1]
        )
        wrapper.plan(  # expect: FC102
            self.qo_indptr[: bs + 1], kv_indptr, kv_indices, seq_lens.to(torch.int32), self.num_local_heads, self.kv_lora_rank,
            self.qk_rope_head_dim, 1, False, self.scaling, self.q_data_type, self.data_type,
        )

    def _plan_ragged(self, forward_batch: ForwardBatch) -> PrefillMetadata:
        qo_indptr = self.qo_indptr_cpu_extend[: forward_batch.batch_size + 1]
        qo_indptr[1:] = torch.from_numpy(np.cumsum(forward_batch.extend_seq_lens_cpu, dtype=np.int32))
        self.ragged_wrapper.begin_forward(  # ok: FC102
            qo_indptr, qo_indptr, self.num_local_heads, self.num_local_heads, self.qk_nope_head_dim + self.qk_rope_head_dim,
            head_dim_vo=self.v_head_dim, q_data_type=self.q_data_type, causal=True, sm_scale=self.scaling,
        )
        return PrefillMetadata(use_ragged=True, ragged=self.ragged_wrapper)

    def _plan_prefix_extend(self, forward_batch: ForwardBatch) -> PrefillMetadata:
        bs = forward_batch.batch_size
        qo_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(forward_batch.extend_seq_lens_cpu, out=qo_indptr_np[1:])
        kv_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(forward_batch.seq_lens_cpu.numpy(), out=kv_indptr_np[1:])
        kv_indptr = torch.from_numpy(kv_indptr_np).to(self.device, non_blocking=True)
        kv_indices = torch.empty(forward_batch.seq_lens_sum, dtype=torch.int32, device=self.device)
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, kv_indptr, kv_indices, self.req_to_token.shape[1]
        )
        self.prefill_wrapper_paged.plan(  # expect: FC102
            torch.from_numpy(qo_indptr_np), torch.from_numpy(kv_indptr_np), kv_indices, forward_batch.seq_lens.to(torch.int32),
            self.num_local_heads, self.kv_lora_rank, self.qk_rope_head_dim, 1, True, self.scaling, self.q_data_type, self.data_type,
        )
        return PrefillMetadata(use_ragged=False, paged=self.prefill_wrapper_paged, prefix_kv_indptr=kv_indptr)

    def _trtllm_metadata(self, forward_batch: ForwardBatch) -> TrtllmDecodeMetadata:
        max_seq_len = int(forward_batch.seq_lens.max())  # expect: FC101
        max_blocks = triton.cdiv(max_seq_len, self.page_size)
        rows = self.req_to_token[forward_batch.req_pool_indices]
        block_kv_indices = rows[:, : max_blocks * self.page_size : self.page_size] // self.page_size
        return TrtllmDecodeMetadata(block_kv_indices, max_seq_len)

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.cuda_graph_kv_indices = torch.zeros((max_bs * self.max_context_len,), dtype=torch.int32, device=self.device)
        self.cuda_graph_qo_indptr = torch.arange(0, max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indptr = torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_lens = torch.ones((max_bs,), dtype=torch.int32, device=self.device)
        self.cuda_graph_qo_indptr_cpu = torch.arange(0, max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cuda_graph_kv_indptr_cpu = torch.zeros((max_bs + 1,), dtype=torch.int32, pin_memory=True)
        self.cuda_graph_kv_lens_cpu = torch.ones((max_bs,), dtype=torch.int32, pin_memory=True)

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, forward_mode) -> None:
        if forward_mode == ForwardMode.TARGET_VERIFY:
            self._plan_verify(bs, num_tokens // bs, req_pool_indices, seq_lens, torch.ones((bs,), dtype=torch.int32))
            self.forward_metadata = PrefillMetadata(use_ragged=False, paged=self.prefill_wrapper_paged)
            return
        wrapper = BatchMLAPagedAttentionWrapper(
            self.workspace_buffer,
            use_cuda_graph=True,
            qo_indptr=self.cuda_graph_qo_indptr[: bs + 1],
            kv_indptr=self.cuda_graph_kv_indptr[: bs + 1],
            kv_indices=self.cuda_graph_kv_indices,
            kv_len_arr=self.cuda_graph_kv_lens[:bs],
            backend="fa2",
        )
        self.cuda_graph_kv_lens[:bs].fill_(1)  # ok: FC104
        self._replay_plan(wrapper, bs, bs, req_pool_indices, seq_lens, torch.ones((bs,), dtype=torch.int32))
        self.cuda_graph_decode_wrappers[bs] = wrapper
        self.forward_metadata = DecodeMetadata(wrapper)

    def init_forward_metadata_replay_cuda_graph(self, bs, raw_bs, req_pool_indices, seq_lens, seq_lens_cpu, forward_mode) -> None:
        if forward_mode == ForwardMode.TARGET_VERIFY:
            self._plan_verify(bs, self.num_draft_tokens, req_pool_indices, seq_lens, seq_lens_cpu)
            self.forward_metadata = PrefillMetadata(use_ragged=False, paged=self.prefill_wrapper_paged)
            return
        wrapper = self.cuda_graph_decode_wrappers[bs]
        self._replay_plan(wrapper, bs, raw_bs, req_pool_indices, seq_lens, seq_lens_cpu)
        # padded rows read one token of slot 0 so the captured kernel stays in bounds
        self.cuda_graph_kv_lens[raw_bs:bs].fill_(1)  # expect: FC104
        self.forward_metadata = DecodeMetadata(wrapper)

    def _replay_plan(self, wrapper, bs, raw_bs, req_pool_indices, seq_lens, seq_lens_cpu) -> None:
        kv_indptr_cpu = self.cuda_graph_kv_indptr_cpu[: bs + 1]
        torch.cumsum(seq_lens_cpu[:raw_bs], dim=0, out=kv_indptr_cpu[1 : raw_bs + 1])
        kv_indptr_cpu[raw_bs + 1 :] = kv_indptr_cpu[raw_bs]
        kv_lens_cpu = self.cuda_graph_kv_lens_cpu[:bs]
        kv_lens_cpu[:raw_bs] = seq_lens_cpu[:raw_bs]
        self.cuda_graph_kv_indptr[: bs + 1].copy_(kv_indptr_cpu, non_blocking=True)  # ok: FC104
        self.cuda_graph_kv_lens[:raw_bs].copy_(seq_lens[:raw_bs])
        create_flashinfer_kv_indices_triton[(raw_bs,)](  # ok: FC104
            self.req_to_token, req_pool_indices, seq_lens, self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices, self.req_to_token.shape[1]
        )
        fast_mla_decode_plan(  # ok: FC102
            wrapper, qo_indptr=self.cuda_graph_qo_indptr_cpu[: bs + 1], kv_indptr=kv_indptr_cpu, kv_indices=self.cuda_graph_kv_indices,
            kv_len_arr=kv_lens_cpu, num_heads=self.num_local_heads, head_dim_ckv=self.kv_lora_rank, head_dim_kpe=self.qk_rope_head_dim,
            page_size=1, causal=False, sm_scale=self.scaling, q_data_type=self.q_data_type, kv_data_type=self.data_type,
        )

    def _plan_verify(self, bs, num_draft_tokens, req_pool_indices, seq_lens, seq_lens_cpu) -> None:
        qo_indptr_cpu = torch.arange(0, (bs + 1) * num_draft_tokens, num_draft_tokens, dtype=torch.int32)
        kv_lens_cpu = seq_lens_cpu[:bs] + num_draft_tokens
        kv_indptr_cpu = torch.zeros((bs + 1,), dtype=torch.int32)
        torch.cumsum(kv_lens_cpu, dim=0, out=kv_indptr_cpu[1:])
        self.cuda_graph_kv_indptr[: bs + 1].copy_(kv_indptr_cpu, non_blocking=True)
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token, req_pool_indices, seq_lens + num_draft_tokens, self.cuda_graph_kv_indptr, self.cuda_graph_kv_indices, self.req_to_token.shape[1]
        )
        self.prefill_wrapper_paged.plan(
            qo_indptr=qo_indptr_cpu, kv_indptr=kv_indptr_cpu, kv_indices=self.cuda_graph_kv_indices, kv_len_arr=kv_lens_cpu,
            num_heads=self.num_local_heads, head_dim_ckv=self.kv_lora_rank, head_dim_kpe=self.qk_rope_head_dim, page_size=1,
            causal=True, sm_scale=self.scaling, q_data_type=self.q_data_type, kv_data_type=self.data_type,
        )

    # ------------------------------------------------------------------ forward

    def forward_decode(self, q_nope, q_rope, kv_buffer, layer, forward_batch, **kwargs) -> torch.Tensor:
        md = self.forward_metadata
        if isinstance(md, TrtllmDecodeMetadata):
            query = torch.cat([q_nope, q_rope], dim=-1).unsqueeze(1)
            out = trtllm_batch_decode_with_kv_cache_mla(
                query=query, kv_cache=kv_buffer.unsqueeze(1), workspace_buffer=self.trtllm_workspace,
                qk_nope_head_dim=self.qk_nope_head_dim, kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim,
                block_tables=md.block_kv_indices, seq_lens=forward_batch.seq_lens, max_seq_len=md.max_seq_len, bmm1_scale=layer.scaling,
            )
            return out.squeeze(1)
        ckv = kv_buffer[..., : self.kv_lora_rank]
        kpe = kv_buffer[..., self.kv_lora_rank :]
        return md.wrapper.run(q_nope, q_rope, ckv, kpe)  # ok: FC108

    def forward_extend(self, q, k, v, layer, forward_batch, **kwargs) -> torch.Tensor:
        if forward_batch.forward_mode == ForwardMode.TARGET_VERIFY:
            # draft tokens attend to the latent cache in absorbed form: k is q_rope, v the latent buffer
            ckv, kpe = v[..., : self.kv_lora_rank], v[..., self.kv_lora_rank :]
            return self.prefill_wrapper_paged.run(q, k, ckv, kpe)  # expect: FC108
        md = self.forward_metadata
        assert isinstance(md, PrefillMetadata), "extend forward without extend metadata"  # ok: FC109
        if md.use_ragged:
            return md.ragged.forward(q, k, v, causal=True, sm_scale=layer.scaling)
        if kwargs.get("mha_chunked_prefix"):
            # the MHA-chunk path needs the cached latent prefix gathered; the decode graph's index
            # buffer sits idle during extend, so reuse it instead of allocating per layer
            prefix_indices = self.cuda_graph_kv_indices[: forward_batch.seq_lens_sum]
            create_flashinfer_kv_indices_triton[(forward_batch.batch_size,)](  # expect: FC104
                self.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, md.prefix_kv_indptr, prefix_indices, self.req_to_token.shape[1]
            )
            return v[prefix_indices]
        return md.paged.run(q, k, v[..., : self.kv_lora_rank], v[..., self.kv_lora_rank :])
