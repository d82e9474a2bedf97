import types

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from srt.utils import ws_defaults


def _plan_with_cached_layout(obj, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size):
    layout = obj._kv_layout  # expect: FC103
    return obj.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, kv_layout=layout)


class StepAttnBackend:
    """One speculative step: its own graph-mode decode wrapper over a row of the shared indptr."""

    def __init__(self, model_runner, kv_indptr_row, kv_indices, last_page_len, workspace):
        self.num_heads = model_runner.num_heads
        self.num_kv_heads = model_runner.num_kv_heads
        self.head_dim = model_runner.head_dim
        self.kv_indptr = kv_indptr_row
        self.kv_indptr_cpu = torch.zeros_like(kv_indptr_row, device="cpu").pin_memory()
        self.last_page_len_cpu = torch.ones(last_page_len.shape[0], dtype=torch.int32, pin_memory=True)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr,
            paged_kv_indices_buffer=kv_indices, paged_kv_last_page_len_buffer=last_page_len,
        )
        self.decode_wrapper.plan_cached = types.MethodType(_plan_with_cached_layout, self.decode_wrapper)
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self.kv_indices = kv_indices
        self.last_page_len = last_page_len

    def init_forward_metadata_replay_cuda_graph(self, bs, seq_lens_cpu):
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(seq_lens_cpu, 0)
        self.decode_wrapper.plan_cached(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.last_page_len_cpu[:bs],
            self.num_heads, self.num_kv_heads, self.head_dim, 1,
        )

    def init_forward_metadata(self, bs):
        self.decode_wrapper.plan(  # expect: FC102
            self.kv_indptr[: bs + 1], self.kv_indices, self.last_page_len[:bs],
            self.num_heads, self.num_kv_heads, self.head_dim, 1,
        )

    def forward_decode(self, q, kv_cache):
        return self.decode_wrapper.run(q, kv_cache)  # ok: FC108

    def forward_verify(self, q, kv_cache):
        return self.verify_wrapper.run(q, kv_cache)  # expect: FC108


class MultiStepDraftBackend:
    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        assert topk == 1, "only chain drafts are supported"  # expect: FC109
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        max_bs = model_runner.max_bs
        dev = model_runner.device
        self.workspace = torch.zeros(ws_defaults.DRAFT_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.ctx_workspace = self.workspace.new_empty(max_bs * model_runner.max_context_len * 16)  # expect: FC105
        self.ctx_zero_workspace = torch.zeros(max_bs * model_runner.max_context_len * 16, dtype=torch.uint8, device=dev)  # ok: FC105
        self.kv_indptr = torch.zeros(speculative_num_steps, max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buffer = torch.zeros(speculative_num_steps, max_bs * model_runner.max_context_len, dtype=torch.int32, device=dev)
        self.last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.attn_backends = [
            StepAttnBackend(model_runner, self.kv_indptr[i], self.kv_indices_buffer[i], self.last_page_len, self.workspace)
            for i in range(speculative_num_steps)
        ]

    def _check_topk(self):
        assert self.topk == 1  # ok: FC109

    def common_template(self, bs, seq_lens_cpu, call_fn):
        self._check_topk()
        needed = int(seq_lens_cpu.sum()) + bs * self.speculative_num_steps  # ok: FC101
        if needed > self.kv_indices_buffer.shape[1]:
            self.kv_indices_buffer.resize_(self.speculative_num_steps, needed)  # expect: FC107
        for i in range(self.speculative_num_steps - 1):
            call_fn(i, seq_lens_cpu + i + 1)

    def init_forward_metadata_replay_cuda_graph(self, bs, seq_lens_cpu):
        def call_fn(i, lens_cpu):
            self.attn_backends[i].init_forward_metadata_replay_cuda_graph(bs, lens_cpu)

        self.common_template(bs, seq_lens_cpu, call_fn)

    def context_attention(self, q, kv_cache, block_tables, seq_lens, max_len):
        out = trtllm_batch_context_with_kv_cache(q, kv_cache, workspace_buffer=self.ctx_workspace, block_tables=block_tables, seq_lens=seq_lens, max_q_len=max_len, max_kv_len=max_len)
        out_zeroed = trtllm_batch_context_with_kv_cache(q, kv_cache, workspace_buffer=self.ctx_zero_workspace, block_tables=block_tables, seq_lens=seq_lens, max_q_len=max_len, max_kv_len=max_len)
        return out, out_zeroed
