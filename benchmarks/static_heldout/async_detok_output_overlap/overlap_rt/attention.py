import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.cascade import merge_state

from overlapserve.settings import PREFILL_WS_BYTES, ServeSettings

# wrapper fields compared between the in-flight step and the one being planned (overlap debugging)
_PLAN_STATE = ("_plan_info", "_fixed_batch_size")


class OverlapAttention:
    def __init__(self, settings: ServeSettings, kv_cache, device):
        s = settings
        self.settings = s
        self.kv_cache = kv_cache
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self.decode_backend = "trtllm-gen" if s.sm_version >= 100 else "fa2"
        self.decode_workspace = torch.empty(s.decode_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.graph_workspace = torch.empty(s.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.zeros(PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged_workspace = torch.zeros(s.max_prefill_tokens * s.num_qo_heads * 512, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, backend=self.decode_backend
        )
        self.paged_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.ragged_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, self._kv_layout)
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.system_pages = torch.arange(s.system_prompt_pages, dtype=torch.int32, device=device)
        self.graph_wrappers = {}
        mb = s.max_batch
        self.kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(s.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(mb, dtype=torch.int32, device=device)

    def init_graph_buffers(self):
        self.kv_indices.zero_()  # ok: FC104

    def bind_bucket(self, bs):
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            backend="fa2",
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = wrapper
        return wrapper

    def plan_bucket(self, meta):
        s = self.settings
        bucket = meta.bucket
        nidx = meta.kv_indices_np.shape[0]
        self.kv_indptr[: bucket + 1].copy_(meta.kv_indptr_cpu[: bucket + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nidx].copy_(torch.from_numpy(meta.kv_indices_np), non_blocking=True)
        self.graph_wrappers[bucket].plan(
            meta.kv_indptr_cpu[: bucket + 1],
            self.kv_indices[:nidx],
            meta.last_page_cpu[:bucket],
            s.num_qo_heads,
            s.num_kv_heads,
            s.head_dim,
            s.page_size,
        )

    def snapshot_wrapper_state(self, bucket):
        w = self.graph_wrappers[bucket]
        return {name: getattr(w, name) for name in _PLAN_STATE}  # expect: FC103

    def forward_decode(self, q, layer_id, meta):
        kv = self.kv_cache[layer_id]
        if meta.bucket:
            w = self.graph_wrappers[meta.bucket]
        else:
            w = self.eager_decode
        out = w.run(q, kv, return_lse=meta.shared_prefix)  # ok: FC108
        if not meta.shared_prefix:
            return out
        o_sfx, lse_sfx = out
        # the shared system prompt is attended once for the whole batch and merged in
        o_pfx, lse_pfx = self.prefix_wrapper.run_return_lse(q, kv)  # expect: FC108
        o, _ = merge_state(o_pfx, lse_pfx, o_sfx, lse_sfx)
        return o

    def forward_extend(self, q, k, v, layer_id):
        o_new, lse_new = self.ragged_prefill.run_return_lse(q, k, v)
        o_old, lse_old = self.paged_prefill.run_return_lse(q, self.kv_cache[layer_id])
        o, _ = merge_state(o_new, lse_new, o_old, lse_old)
        return o
