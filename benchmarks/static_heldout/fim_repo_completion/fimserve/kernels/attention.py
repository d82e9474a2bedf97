"""FlashInfer attention for completions (namespace package: no __init__.py)."""
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper as DecodeW
from flashinfer import BatchPrefillWithPagedKVCacheWrapper as PrefillW
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from fimserve.limits import REPO_WS_BYTES, ServeLimits
from fimserve.repo_cache import RepoContextCache


def _skip_replan(self, *args, **kwargs):
    """Installed on the repo-context decode wrapper by ops scripts when the batch shape is unchanged."""
    if self._cached_module is not None and kwargs.get("same_shape"):  # expect: FC103
        return None
    return DecodeW.plan(self, *args)


class FimAttention:
    def __init__(self, limits: ServeLimits, repo_cache: RepoContextCache, device):
        self.limits = limits
        self.device = device
        self.repo_cache = repo_cache
        self._backend = "fa2"
        self.ws_bytes = limits.workspace_bytes()
        self.graph_ws = torch.zeros(self.ws_bytes, dtype=torch.uint8, device=device)
        self.prefill_ws = torch.empty(limits.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.trt_ws = torch.empty(self.ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.xqa_ws = torch.zeros(self.ws_bytes, dtype=torch.uint8, device=device)
        self.repo_ws = torch.zeros(REPO_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.fa3_ws = torch.empty(self.ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        max_bs = limits.max_batch
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(limits.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.buckets = list(limits.buckets)
        self.graph_wrappers = []
        for bs in self.buckets:
            self.graph_wrappers.append(
                DecodeW(
                    self.graph_ws,
                    "NHD",
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                    paged_kv_indices_buffer=self.kv_indices,
                    paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                )
            )
        self.repo_decode = DecodeW(self.repo_ws, "NHD")
        self.trt_decode = DecodeW(self.trt_ws, "HND", backend="trtllm-gen")
        self.prefill = PrefillW(self.prefill_ws, "NHD", backend="fa2")
        self.repo_prefill = PrefillW(self.fa3_ws, "NHD", backend="fa3")

    def init_buffers(self):
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def plan_prefill(self, batch):
        lim = self.limits
        self.prefill.plan(  # expect: FC102
            batch.qo_indptr_cpu,
            batch.kv_indptr_device,
            batch.kv_indices,
            batch.last_len_cpu,
            lim.num_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
            causal=True,
        )
        self.repo_prefill.plan(  # ok: FC102
            batch.qo_indptr_cpu,
            batch.repo_kv_indptr_cpu,
            batch.repo_kv_indices,
            batch.repo_last_len_cpu,
            lim.num_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
            causal=False,
        )

    def plan_decode(self, bs: int, batch):
        lim = self.limits
        self.kv_indptr_host[: bs + 1].copy_(batch.kv_indptr_cpu)
        self.last_len_host[:bs].copy_(batch.last_len_cpu)
        n = batch.num_pages
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:bs].copy_(self.last_len_host[:bs], non_blocking=True)
        w = self.graph_wrappers[self.buckets.index(bs)]
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:n],
            self.last_len_host[:bs],
            lim.num_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
        )
        self.kv_indices[n:].zero_()  # expect: FC104

    def prefill_plan_snapshot(self):
        return vars(self.prefill)["_plan_info"]  # expect: FC103

    def describe(self):
        backend = self._backend  # ok: FC103
        layout = self.repo_cache._kv_layout  # ok: FC103
        return {"backend": backend, "layout": layout}

    def plan_for_capture(self, bs: int):
        lim = self.limits
        w = self.graph_wrappers[self.buckets.index(bs)]
        w.plan(
            self.kv_indptr_host[: bs + 1],
            self.kv_indices,
            self.last_len_host[:bs],
            lim.num_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
        )

    def forward_decode(self, q, kv_cache, bs: int):
        return self.graph_wrappers[self.buckets.index(bs)].run(q, kv_cache)  # ok: FC108

    def forward_repo(self, q, repo_kv):
        return self.repo_decode.run(q, repo_kv, return_lse=True)  # expect: FC108

    def forward_long(self, q, kv_cache, block_tables, seq_lens, max_len):
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, self.xqa_ws, block_tables, seq_lens, max_len)
