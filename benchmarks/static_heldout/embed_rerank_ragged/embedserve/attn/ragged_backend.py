import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer import trtllm_batch_context_with_kv_cache

from embedserve.batch import EmbedBatch
from embedserve.config import GRAPH_WORKSPACE_BYTES, PREFIX_PAGE_SIZE, EmbedConfig


class RaggedEmbedBackend:
    """Bidirectional attention over packed sequences; the only KV cache is the reranker's query prefix."""

    def __init__(self, cfg: EmbedConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = cfg.kv_layout  # ok: FC103
        self._plan_info = None
        self.float_workspace = torch.empty(self._eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.eager_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.float_workspace, self._kv_layout)
        self.prefix_workspace = torch.zeros(cfg.max_num_tokens * cfg.num_heads * 512, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, self._kv_layout)
        self.ctx_workspace = torch.empty(cfg.max_num_tokens * 2048, dtype=torch.uint8, device=device)  # expect: FC105
        self.prefix_last_page_len_gpu = torch.ones(cfg.max_batch, dtype=torch.int32, device=device)
        self.prefix_kv_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.prefix_qo_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.prefix_kv_cache = None
        self.graph_wrappers = {}
        self.qo_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.cur_wrapper = self.eager_wrapper

    def _eager_workspace_bytes(self):
        # split-k partial outputs: tokens x heads x head_dim in fp32, plus the planner's int scratch
        cfg = self.cfg
        return cfg.max_num_tokens * cfg.num_heads * cfg.head_dim * 4 + (8 << 20)

    def init_cuda_graph_state(self):
        cfg = self.cfg
        self.graph_workspace = torch.zeros(GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.qo_indptr = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=self.device)
        for n in cfg.token_buckets:
            self.graph_wrappers[n] = BatchPrefillWithRaggedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                qo_indptr_buf=self.qo_indptr,
                kv_indptr_buf=self.kv_indptr,
            )

    # ---- eager batches (larger than every bucket) ----
    def init_forward_metadata(self, batch: EmbedBatch):
        total_tokens = int(batch.cu_seqlens[-1])  # expect: FC101
        if total_tokens > self.cfg.max_num_tokens:
            raise ValueError(f"{total_tokens} tokens > max_num_tokens={self.cfg.max_num_tokens}")
        self.eager_wrapper.plan(  # expect: FC102
            batch.cu_seqlens, batch.cu_seqlens_cpu, self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
            causal=False,
        )
        if self.eager_wrapper._causal:  # expect: FC103
            raise RuntimeError("embedding attention must be bidirectional")
        self._plan_info = (batch.num_tokens, len(batch.seq_lens_cpu))  # ok: FC103
        self.cur_wrapper = self.eager_wrapper
        if batch.is_rerank:
            self.plan_rerank_prefix(batch)

    def plan_rerank_prefix(self, batch: EmbedBatch):
        bs = len(batch.seq_lens_cpu)
        last_len = batch.prefix_len % PREFIX_PAGE_SIZE or PREFIX_PAGE_SIZE
        self.prefix_last_page_len_gpu = torch.full((bs,), last_len, dtype=torch.int32, device=self.device)  # expect: FC107
        self.prefix_kv_indptr_host[: bs + 1].copy_(batch.prefix_page_indptr_cpu)
        self.prefix_qo_indptr_host[: bs + 1].copy_(batch.cu_seqlens_cpu)
        self.prefix_wrapper.plan(  # expect: FC102
            self.prefix_qo_indptr_host[: bs + 1],
            self.prefix_kv_indptr_host[: bs + 1],
            batch.prefix_pages,
            self.prefix_last_page_len_gpu,
            self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PREFIX_PAGE_SIZE,
            causal=False,
        )

    # ---- graphs per padded token count ----
    def init_forward_metadata_capture_cuda_graph(self, n: int, bs: int):
        w = self.graph_wrappers[n]
        per_seq = n // bs
        self.qo_indptr_host.copy_(torch.arange(0, self.cfg.max_batch + 1, dtype=torch.int32).clamp_(max=bs) * per_seq)
        w.plan(self.qo_indptr_host, self.qo_indptr_host, self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, causal=False)
        self.cur_wrapper = w

    def init_forward_metadata_replay_cuda_graph(self, n: int, batch: EmbedBatch):
        bs = len(batch.seq_lens_cpu)
        if int(batch.seq_lens_cpu.max()) > self.cfg.max_seq_len:  # ok: FC101
            raise ValueError(f"sequence longer than max_seq_len={self.cfg.max_seq_len}")
        w = self.graph_wrappers[n]
        self.qo_indptr_host[: bs + 1].copy_(batch.cu_seqlens_cpu)
        self.qo_indptr_host[bs + 1 :].fill_(n)
        self.kv_indptr[: bs + 1].copy_(batch.cu_seqlens, non_blocking=True)  # ok: FC104
        w.plan(  # ok: FC102
            self.qo_indptr_host, self.qo_indptr_host, self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim,
            causal=False,
        )
        self.qo_indptr[bs + 1 :].fill_(batch.num_tokens)  # expect: FC104
        self.qo_indptr_host[bs + 1 :].zero_()  # ok: FC104
        self.cur_wrapper = w

    # ---- kernels ----
    def forward(self, q, k, v):
        return self.cur_wrapper.run(q, k, v)  # ok: FC108

    def forward_prefix(self, q):
        return self.prefix_wrapper.run(q, self.prefix_kv_cache)  # expect: FC108

    def forward_prefix_trtllm(self, q, block_tables, seq_lens, max_q_len, max_kv_len, batch_size, cu_q, cu_kv):
        return trtllm_batch_context_with_kv_cache(
            q, self.prefix_kv_cache, self.ctx_workspace, block_tables, seq_lens, max_q_len, max_kv_len,
            self.cfg.head_dim ** -0.5, 1.0, batch_size, cu_q, cu_kv,
        )
