"""FlashInfer MLA backend, shaped like SGLang's flashinfer_mla_backend.py (enum dispatch, closures)."""

import functools
from typing import Dict, Optional

import torch
from flashinfer import BatchMLAPagedAttentionWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from srt.layers.attention.mla_utils.workspace import get_fa2_workspace, get_trtllm_mla_workspace
from srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


class FlashInferMLAAttnBackend:
    def __init__(self, model_runner, use_trtllm_decode: bool = False):
        self.device = model_runner.device
        self.max_bs = model_runner.req_to_token_pool.size
        self.max_context_len = model_runner.model_config.context_len
        self.num_local_heads = model_runner.model_config.num_attention_heads // model_runner.tp_size
        self.kv_lora_rank = model_runner.model_config.kv_lora_rank
        self.qk_rope_head_dim = model_runner.model_config.qk_rope_head_dim
        self.use_trtllm_decode = use_trtllm_decode
        self.workspace_buffer = get_fa2_workspace(self.device, model_runner.max_total_num_tokens, self.num_local_heads)
        self.kv_indptr = torch.zeros((self.max_bs + 1,), dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros((self.max_bs + 1,), dtype=torch.int32, pin_memory=True)
        self.kv_len_arr_cpu = torch.zeros((self.max_bs,), dtype=torch.int32, pin_memory=True)
        self.kv_indices = None
        self.prefill_wrapper_ragged = BatchPrefillWithRaggedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.decode_wrapper = BatchMLAPagedAttentionWrapper(self.workspace_buffer, backend="auto")
        self.graph_wrappers: Dict[int, BatchMLAPagedAttentionWrapper] = {}
        self.forward_metadata = None

    @functools.cached_property
    def q_indptr_decode_cpu(self) -> torch.Tensor:
        return torch.arange(0, self.max_bs + 1, dtype=torch.int32)

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        match forward_batch.forward_mode:
            case ForwardMode.DECODE | ForwardMode.IDLE:
                self._update_decode(forward_batch.batch_size, forward_batch, self.decode_wrapper)
            case ForwardMode.EXTEND:
                prefix = sum(forward_batch.extend_prefix_lens_cpu)  # ok: FC101
                self.forward_metadata = ("extend", prefix)
            case _:
                raise NotImplementedError(forward_batch.forward_mode)

    def _update_decode(self, bs: int, forward_batch: ForwardBatch, wrapper, graph: bool = False):
        seq_lens = forward_batch.seq_lens

        def _plan(w, indptr, kv_lens):
            w.plan(  # expect: FC102
                self.q_indptr_decode_cpu[: bs + 1],
                indptr,
                self.kv_indices,
                kv_lens,
                self.num_local_heads,
                self.kv_lora_rank,
                self.qk_rope_head_dim,
                1,
                False,
                1.0,
                torch.bfloat16,
                torch.bfloat16,
            )

        self.kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens, dim=0)  # ok: FC104
        if graph:
            self.kv_len_arr_cpu[:bs].copy_(forward_batch.seq_lens_cpu)
            self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(forward_batch.seq_lens_cpu, dim=0)
            _plan(wrapper, self.kv_indptr_cpu[: bs + 1], self.kv_len_arr_cpu[:bs])
        else:
            _plan(wrapper, self.kv_indptr[: bs + 1], seq_lens)
        if (longest := seq_lens.max()) > self.max_context_len:  # expect: FC101
            raise ValueError(f"sequence of {longest} tokens exceeds the context")

    def init_forward_metadata_capture_cuda_graph(self, bs: int, num_tokens: int, forward_batch: ForwardBatch):
        assert bs <= self.max_bs, "batch larger than the graph pool"  # expect: FC109
        if self.kv_indices is None:
            self.kv_indices = torch.zeros(self.max_bs * self.max_context_len, dtype=torch.int32, device=self.device)  # ok: FC107
        w = BatchMLAPagedAttentionWrapper(
            self.workspace_buffer,
            use_cuda_graph=True,
            qo_indptr=self.q_indptr_decode_cpu[: bs + 1].to(self.device),
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_indices=self.kv_indices,
            kv_len_arr=torch.ones(bs, dtype=torch.int32, device=self.device),
        )
        self.graph_wrappers[bs] = w
        self._update_decode(bs, forward_batch, w, graph=True)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, forward_batch: ForwardBatch):
        needed = int(forward_batch.seq_lens_cpu[:bs].sum())  # ok: FC101
        if needed > self.kv_indices.numel():
            self.kv_indices = torch.empty(needed, dtype=torch.int32, device=self.device)  # expect: FC107
        self._update_decode(bs, forward_batch, self.graph_wrappers[bs], graph=True)
        self.kv_indptr[bs + 1 :].fill_(0)  # expect: FC104
        saved = self.graph_wrappers[bs]._plan_info  # expect: FC103
        self.forward_metadata = ("decode", saved)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int):
        if bs in self.graph_wrappers:
            return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108
        if self.use_trtllm_decode:
            ws = get_trtllm_mla_workspace(str(self.device))
            return trtllm_batch_decode_with_kv_cache_mla(q, kv_cache, ws, self.kv_lora_rank)
        return self.decode_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_extend(self, q, k, v):
        return self.prefill_wrapper_ragged.forward(q, k, v, causal=True)  # ok: FC108

    def reset_sparse_indptr(self, bs: int, sparse_lens: torch.Tensor):
        self.kv_indptr[1 : bs + 1] = torch.cumsum(sparse_lens, dim=0)  # expect: FC104
        self.kv_indptr_cpu.zero_()  # ok: FC104
