from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from flashinfer import BatchMLAPagedAttentionWrapper


@dataclass
class DecodeMetadata:
    decode_wrapper: BatchMLAPagedAttentionWrapper


def fast_mla_decode_plan(w, qo_indptr_cpu, kv_indptr_cpu, kv_indices, kv_len_arr_cpu, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type):
    """Replay-time MLA plan: host arrays only, no validation."""
    w._sm_scale = sm_scale  # expect: FC103
    w._plan_info = w._cached_module.plan(w._float_workspace_buffer, w._int_workspace_buffer, w._pin_memory_int_workspace_buffer, qo_indptr_cpu, kv_indptr_cpu, kv_len_arr_cpu, num_heads, head_dim_ckv, causal)  # expect: FC103


class FlashInferMLAAttnBackend:
    def __init__(self, model_runner, kv_indptr_buf=None):
        self.device = model_runner.device
        self.max_context_len = model_runner.model_config.context_len
        self.num_heads = model_runner.model_config.num_attention_heads
        self.kv_lora_rank = model_runner.model_config.kv_lora_rank
        self.qk_rope_head_dim = model_runner.model_config.qk_rope_head_dim
        self.scaling = model_runner.model_config.scaling
        self.page_size = 1
        max_bs = model_runner.req_to_token_pool.size
        self.workspace_buffer = torch.empty(model_runner.server_args.flashinfer_workspace_mb << 20, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.kv_indptr = kv_indptr_buf if kv_indptr_buf is not None else torch.zeros((max_bs + 1,), dtype=torch.int32, device=self.device)
        self.q_indptr_decode = torch.arange(0, max_bs + 1, dtype=torch.int32, device=self.device)
        self.decode_wrapper = BatchMLAPagedAttentionWrapper(self.workspace_buffer, backend="auto")  # ok: FC105
        self.decode_cuda_graph_metadata = {}
        self.forward_metadata = None

    def init_forward_metadata(self, forward_batch):
        bs = forward_batch.batch_size
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr_cpu[1:] = torch.cumsum(forward_batch.seq_lens_cpu, dim=0)
        kv_indices = forward_batch.req_to_token_flat[: forward_batch.seq_lens_sum]
        self.decode_wrapper.plan(self.q_indptr_decode[: bs + 1], kv_indptr_cpu, kv_indices, forward_batch.seq_lens.to(torch.int32), self.num_heads, self.kv_lora_rank, self.qk_rope_head_dim, self.page_size, False, self.scaling, torch.bfloat16, torch.bfloat16)  # expect: FC102
        self.forward_metadata = DecodeMetadata(self.decode_wrapper)

    def init_cuda_graph_state(self, max_bs: int):
        self.cuda_graph_kv_indices = torch.zeros((max_bs * self.max_context_len,), dtype=torch.int32, device=self.device)
        self.cuda_graph_qo_indptr = self.q_indptr_decode.clone()
        self.cuda_graph_kv_indptr = self.kv_indptr.clone()
        self.cuda_graph_kv_lens = torch.ones((max_bs,), dtype=torch.int32, device=self.device)
        self.cuda_graph_qo_indptr_cpu = self.cuda_graph_qo_indptr.to("cpu")  # ok: FC101
        self.cuda_graph_kv_indptr_cpu = self.cuda_graph_kv_indptr.to("cpu")  # ok: FC101

    def init_forward_metadata_capture_cuda_graph(self, bs: int, num_tokens: int, seq_lens_cpu: torch.Tensor):
        decode = BatchMLAPagedAttentionWrapper(
            self.workspace_buffer,
            use_cuda_graph=True,
            qo_indptr=self.cuda_graph_qo_indptr[: num_tokens + 1],
            kv_indptr=self.cuda_graph_kv_indptr[: num_tokens + 1],
            kv_indices=self.cuda_graph_kv_indices,
            kv_len_arr=self.cuda_graph_kv_lens[:num_tokens],
            backend="auto",
        )
        self.cuda_graph_kv_indptr_cpu[1 : bs + 1] = torch.cumsum(seq_lens_cpu[:bs], dim=0)
        decode.plan(self.cuda_graph_qo_indptr_cpu[: bs + 1], self.cuda_graph_kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices, seq_lens_cpu[:bs], self.num_heads, self.kv_lora_rank, self.qk_rope_head_dim, self.page_size, False, self.scaling, torch.bfloat16, torch.bfloat16)  # ok: FC102
        decode.plan = partial(fast_mla_decode_plan, decode)
        self.decode_cuda_graph_metadata[bs] = decode
        self.forward_metadata = DecodeMetadata(decode)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, num_draft_tokens: int = 0):
        kv_len_arr_cpu = seq_lens_cpu[:bs]
        self.cuda_graph_kv_indptr_cpu[1 : bs + 1] = torch.cumsum(kv_len_arr_cpu, dim=0)
        self.cuda_graph_kv_lens[:bs].copy_(seq_lens[:bs])  # ok: FC104
        decode = self.decode_cuda_graph_metadata[bs]
        decode.plan(self.cuda_graph_qo_indptr_cpu[: bs + 1], self.cuda_graph_kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices, kv_len_arr_cpu, self.num_heads, self.kv_lora_rank, self.qk_rope_head_dim, self.page_size, False, self.scaling, torch.bfloat16, torch.bfloat16)  # ok: FC102
        if num_draft_tokens:
            self.cuda_graph_kv_lens[:bs] += num_draft_tokens  # expect: FC104
        self.forward_metadata = DecodeMetadata(decode)

    def forward_decode(self, q_nope, q_pe, ckv_cache, kpe_cache):
        return self.forward_metadata.decode_wrapper.run(q_nope, q_pe, ckv_cache, kpe_cache)  # ok: FC108
