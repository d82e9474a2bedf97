import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from reorder.limits import ReorderLimits
from reorder_kernels.permute import permute_page_indices

# graph inputs the backend re-zeroes for each bucket (padding rows must read token 0 at position 0)
_SORTED_INPUTS = ("sorted_ids", "sorted_positions")


class PermutedDecodeBackend:
    """Decode attention over a batch sorted longest-KV-first; graph wrappers per bucket read the sorted page
    lists, which a Triton kernel permutes from the natural-order lists on the device."""

    OVERFLOW_WS_BYTES = 96 << 20

    def __init__(self, limits: ReorderLimits, kv_cache, device):
        lim = limits
        self.limits = lim
        self.kv_cache = kv_cache
        self.device = device
        self.overflow_workspace = torch.zeros(self.OVERFLOW_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_workspace = torch.empty(lim.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_workspace = torch.empty(lim.trtllm_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_workspace.zero_()
        self.prefill_workspace = torch.zeros(
            lim.max_batch * lim.num_qo_heads * lim.head_dim * 512, dtype=torch.uint8, device=device
        )
        self.overflow = BatchDecodeWithPagedKVCacheWrapper(self.overflow_workspace, "NHD")
        self.heavy_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.overflow_workspace, "NHD", use_tensor_cores=True)
        self.prefill = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")
        mb = lim.max_batch
        # graph-bound, sorted order
        self.kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(lim.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(mb, dtype=torch.int32, device=device)
        # natural order, filled from the host every step
        self.natural_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.natural_indices = torch.zeros(lim.max_pages, dtype=torch.int32, device=device)
        self.last_page_natural = torch.ones(mb, dtype=torch.int32, device=device)
        self.pages_dev = torch.zeros(mb, dtype=torch.int32, device=device)
        self.kv_lens_dev = torch.zeros(mb, dtype=torch.int32, device=device)
        # permutation graph inputs
        self.perm_dev = torch.arange(mb, dtype=torch.int64, device=device)
        self.sorted_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.sorted_positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.kv_indptr_cpu = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_cpu = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.overflow_indptr_dev = torch.zeros(4 * mb + 1, dtype=torch.int32, device=device)
        self.heavy_lse = None
        self.graph_wrappers = {}

    def bind_bucket(self, bucket):
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            backend="fa2",
            paged_kv_indptr_buffer=self.kv_indptr[: bucket + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bucket],
        )
        self.graph_wrappers[bucket] = wrapper
        return wrapper

    def plan_for_capture(self, meta):
        lim = self.limits
        b = meta.bucket
        self.kv_indptr_cpu[: b + 1].copy_(meta.kv_indptr_cpu)
        self.last_page_cpu[:b].copy_(meta.last_page_cpu)
        self.graph_wrappers[b].plan(
            self.kv_indptr_cpu[: b + 1],
            self.kv_indices[:b],
            self.last_page_cpu[:b],
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
        )

    def prepare_permuted(self, meta):
        lim = self.limits
        bs, bucket = meta.bs, meta.bucket
        # natural-order page lists from the host; the sorted copy is what the graph reads
        self.natural_indptr[: bs + 1].copy_(meta.kv_indptr_cpu[: bs + 1], non_blocking=True)
        nidx = meta.kv_indices_np.shape[0]
        self.natural_indices[:nidx].copy_(torch.from_numpy(meta.kv_indices_np), non_blocking=True)
        self.last_page_natural[:bs].copy_(meta.last_page_cpu[:bs], non_blocking=True)
        self.pages_dev[:bs].copy_(torch.from_numpy(meta.sorted_pages_np[:bs]), non_blocking=True)
        heavy = int((self.pages_dev[: lim.heavy_rows] >= lim.heavy_min_pages).sum())  # expect: FC101
        self.kv_indptr_cpu[: bucket + 1].copy_(torch.from_numpy(meta.sorted_indptr_np))
        self.last_page_cpu[:bucket].copy_(torch.from_numpy(meta.sorted_last_np))
        self.kv_indptr[: bucket + 1].copy_(self.kv_indptr_cpu[: bucket + 1], non_blocking=True)  # ok: FC104
        permute_page_indices(self.natural_indices, self.natural_indptr, self.kv_indices, self.kv_indptr, self.perm_dev, bs)  # ok: FC104
        for name in _SORTED_INPUTS:
            setattr(self, name, getattr(self, name).new_zeros(bucket))  # expect: FC107
        if getattr(self, "heavy_lse", None) is None:
            self.heavy_lse = torch.empty((lim.heavy_rows, lim.num_qo_heads), dtype=torch.float32, device=self.device)  # ok: FC107
        meta.n_heavy = heavy
        if heavy:
            # sorted longest first: the heavy rows are the first `heavy` rows of the sorted indptr
            self.heavy_wrapper.plan(  # expect: FC102
                self.kv_indptr[: heavy + 1],
                self.kv_indices,
                self.last_page_cpu[:heavy],
                lim.num_qo_heads,
                lim.num_kv_heads,
                lim.head_dim,
                lim.page_size,
            )
        self.graph_wrappers[bucket].plan(  # ok: FC102
            self.kv_indptr_cpu[: bucket + 1],
            self.kv_indices,
            self.last_page_cpu[:bucket],
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
        )
        # the graph reads last-page lengths in sorted order too
        self.kv_last_page_len[:bs].copy_(torch.index_select(self.last_page_natural, 0, self.perm_dev[:bs]))  # expect: FC104

    def plan_overflow(self, kv_indptr_np, kv_indices_np, last_np):
        """Batches larger than the largest bucket run eagerly, unsorted."""
        lim = self.limits
        n = kv_indptr_np.shape[0]
        self.overflow_indptr_dev[:n].copy_(torch.from_numpy(kv_indptr_np), non_blocking=True)
        indices = torch.from_numpy(kv_indices_np).to(self.device, non_blocking=True)
        self.overflow.plan(  # expect: FC102
            self.overflow_indptr_dev[:n],
            indices,
            torch.from_numpy(last_np),
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
        )

    def plan_prefill(self, qo_indptr_np):
        lim = self.limits
        qo_indptr_host = torch.from_numpy(qo_indptr_np)
        self.prefill.plan(qo_indptr_host, qo_indptr_host, lim.num_qo_heads, lim.num_kv_heads, lim.head_dim, causal=True)

    def attend(self, q, layer_id, meta):
        kv = self.kv_cache[layer_id]
        if meta.long_tail:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trtllm_workspace,
                block_tables=meta.block_tables,
                seq_lens=meta.seq_lens_dev,
                max_seq_len=self.limits.max_seq_len,
                bmm1_scale=self.limits.head_dim**-0.5,
                bmm2_scale=1.0,
            )
        w = self.graph_wrappers[meta.bucket] if meta.bucket else self.overflow
        out = w.run(q, kv)  # ok: FC108
        if meta.n_heavy:
            out[: meta.n_heavy] = self.heavy_wrapper.run(q[: meta.n_heavy], kv)  # expect: FC108
        return out

    def prefill_attend(self, q, k, v):
        return self.prefill.run(q, k, v)
