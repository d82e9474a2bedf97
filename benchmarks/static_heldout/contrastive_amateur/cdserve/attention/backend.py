import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from cdserve.batch import DecodeBatch
from cdserve.config import AMATEUR_WORKSPACE_BYTES, CDConfig


class PairedDecodeBackend:
    """Decode wrappers for the expert and the amateur model over one page table."""

    def __init__(self, cfg: CDConfig, device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        self.expert_workspace = torch.zeros(cfg.expert_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.amateur_workspace = torch.zeros(AMATEUR_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.long_ws = torch.empty(cfg.expert_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.prefill_ws = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        max_bs = cfg.max_batch
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers = {}
        for bs in cfg.graph_sizes:
            expert = BatchDecodeWithPagedKVCacheWrapper(
                self.expert_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            amateur = BatchDecodeWithPagedKVCacheWrapper(
                self.amateur_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            self.graph_wrappers[bs] = {"expert": expert, "amateur": amateur}
        self.eager_expert = BatchDecodeWithPagedKVCacheWrapper(self.expert_workspace, self._kv_layout)
        self.eager_amateur = BatchDecodeWithPagedKVCacheWrapper(self.amateur_workspace, self._kv_layout)
        self.long_decode = BatchDecodeWithPagedKVCacheWrapper(self.long_ws, "HND", backend="trtllm-gen")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, self._kv_layout, backend="fa2")

    def init_graph_buffers(self):
        self.kv_indptr.zero_()
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def _heads(self, role):
        if role == "expert":
            return self.cfg.num_qo_heads, self.cfg.num_kv_heads
        return self.cfg.amateur_qo_heads, self.cfg.amateur_kv_heads

    def refresh_inputs(self, batch: DecodeBatch):
        bs = batch.size
        assert self.kv_indptr_cpu.is_pinned()  # ok: FC109
        self.kv_indptr_cpu[: bs + 1].copy_(batch.kv_indptr_cpu)
        self.kv_last_page_len_cpu[:bs].copy_(batch.last_page_len_cpu)
        n = int(batch.kv_indptr_cpu[bs])  # ok: FC101
        if n > self.kv_indices.numel():
            self.kv_indices = torch.zeros(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(batch.page_ids, non_blocking=True)  # ok: FC104
        pair = self.graph_wrappers[bs]
        for role in ("expert", "amateur"):
            qo_heads, kv_heads = self._heads(role)
            pair[role].plan(  # ok: FC102
                self.kv_indptr_cpu[: bs + 1],
                self.kv_indices[:n],
                self.kv_last_page_len_cpu[:bs],
                qo_heads,
                kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
            )
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)  # expect: FC104

    def plan_eager(self, batch: DecodeBatch):
        cfg = self.cfg
        self.eager_expert.plan(  # expect: FC102
            batch.kv_indptr,
            batch.page_ids,
            batch.last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
        )
        self.eager_amateur.plan(  # ok: FC102
            batch.kv_indptr_cpu,
            batch.page_ids,
            batch.last_page_len_cpu,
            cfg.amateur_qo_heads,
            cfg.amateur_kv_heads,
            cfg.head_dim,
            cfg.page_size,
        )

    def plan_prefill(self, prompt_lens, batch: DecodeBatch):
        qo = [0]
        for n in prompt_lens:
            qo.append(qo[-1] + n)
        qo_indptr = torch.tensor(qo, dtype=torch.int32, device=self.device)
        self.prefill.plan(  # expect: FC102
            qo_indptr,
            batch.kv_indptr_cpu,
            batch.page_ids,
            batch.last_page_len_cpu,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
        )

    def describe_state(self):
        info = self.eager_expert._plan_info  # expect: FC103
        return (self._kv_layout, info)  # ok: FC103

    def warm_modules(self):
        for w in (self.eager_expert, self.eager_amateur):
            if getattr(w, "_cached_module", None) is None:  # expect: FC103
                w.plan(self.kv_indptr_cpu[:2], self.kv_indices[:1], self.kv_last_page_len_cpu[:1],
                       self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size)

    def forward_expert(self, q, kv_cache, bs):
        w = self.graph_wrappers[bs]["expert"] if bs in self.graph_wrappers else self.eager_expert
        return w.run(q, kv_cache)  # ok: FC108

    def forward_amateur(self, q, kv_cache, bs):
        return self.eager_amateur.run(q, kv_cache)  # expect: FC108

    def forward_long(self, q, kv_cache):
        return self.long_decode.run(q, kv_cache)
