import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from lightllm.common.basemodel.infer_struct import InferStateInfo
from lightllm.models.llama.triton_kernel.repack_kv_index import repack_kv_index


class LlamaFlashInferStateInfo(InferStateInfo):
    def __init__(self):
        super().__init__()
        self.prefill_wrapper = None
        self.decode_wrapper = None
        self.flashinfer_extra_state = None

    def init_some_extra_state(self, model, input_ids: torch.Tensor):
        super().init_some_extra_state(model, input_ids)
        self.flashinfer_extra_state = model.flashinfer_extra_state
        extra = self.flashinfer_extra_state
        device = input_ids.device
        if not self.is_prefill:
            kv_indptr = torch.zeros(self.batch_size + 1, dtype=torch.int32, device=device)
            kv_indptr[1:] = torch.cumsum(self.b_seq_len, dim=0)
            kv_indices = extra.kv_indices_buffer[self.microbatch_index][: kv_indptr[-1]]  # expect: FC101
            repack_kv_index(
                self.req_manager.req_to_token_indexs, self.b_req_idx, self.b_seq_len,
                kv_indptr[:-1], self.max_len_in_batch, kv_indices,
            )
            last_page_len = torch.ones(self.batch_size, dtype=torch.int32, device=device)
            if self.decode_wrapper is None:
                self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
                    extra.workspace_buffer, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                    paged_kv_indptr_buffer=kv_indptr, paged_kv_indices_buffer=kv_indices,
                    paged_kv_last_page_len_buffer=last_page_len,
                )
            self.decode_wrapper.plan(  # expect: FC102
                kv_indptr, kv_indices, last_page_len,
                extra.tp_q_head_num, extra.tp_kv_head_num, extra.head_dim, 1,
                q_data_type=extra.q_data_type, kv_data_type=extra.kv_data_type, non_blocking=True,
            )
            if self.decode_wrapper._fixed_batch_size != self.batch_size:  # expect: FC103
                raise RuntimeError("decode wrapper was planned for another batch size")
        else:
            q_starts_cpu = torch.zeros(self.batch_size + 1, dtype=torch.int32)
            q_starts_cpu[1:] = torch.cumsum(self.b_seq_len_cpu - self.b_ready_cache_len_cpu, dim=0)
            kv_starts_cpu = torch.zeros(self.batch_size + 1, dtype=torch.int32)
            kv_starts_cpu[1:] = torch.cumsum(self.b_seq_len_cpu, dim=0)
            total = int(kv_starts_cpu[-1])  # ok: FC101
            kv_indices = extra.kv_indices_buffer[self.microbatch_index][:total]  # ok: FC101
            self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(extra.workspace_buffer, qo_indptr_buf=None)
            self.prefill_wrapper.plan(  # ok: FC102
                q_starts_cpu, kv_starts_cpu, kv_indices, torch.ones(self.batch_size, dtype=torch.int32),
                extra.tp_q_head_num, extra.tp_kv_head_num, extra.head_dim, 1, causal=True,
            )
            self._plan_info = (self.batch_size, total)  # ok: FC103
