import functools

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import MultiLevelCascadeAttentionWrapper

from rcengine.batch import StepMeta
from rcengine.config import ServeConfig


class SharedPrefixCascadeBackend:
    """System-prompt sharing through a two-level cascade. Eager only: it has no `init_cuda_graph_state`,
    so `isinstance(b, SupportsCudaGraph)` is False and the graph runner never prepares it."""

    def __init__(self, cfg: ServeConfig, kv_cache):
        self.cfg, self.kv_cache, self.device = cfg, kv_cache, torch.device(cfg.device)
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        cascade_workspace = torch.empty(cfg.cascade_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(2, cascade_workspace, "NHD")
        decode_workspace = torch.empty(cfg.max_tokens * 2048, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(decode_workspace, "NHD")
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(cascade_workspace, "NHD")
        self._plan_prefill = functools.partial(self.prefill_wrapper.plan, causal=True)
        self.prefix_indices = torch.zeros(cfg.total_pages // 8, dtype=torch.int32, device=self.device)
        self.prefix_pages = 0

    def shared_prefix_pages(self) -> int:
        return self.prefix_pages

    def plan_cascade(self, meta: StepMeta) -> None:
        b = meta.batch
        prefix_len = b.shared_prefix_len_cpu
        assert prefix_len % self.cfg.page_size == 0, "shared prefix must be page aligned"  # expect: FC109
        distinct = b.prefix_lens.unique()  # expect: FC101
        if distinct.numel() > 1:  # ok: FC101
            raise ValueError("requests in one cascade batch disagree on the shared prefix")
        n = prefix_len // self.cfg.page_size
        if n != self.prefix_pages or not torch.equal(self.prefix_indices[:n], b.kv_indices[:n]):  # expect: FC101
            self.prefix_indices = b.kv_indices[:n].clone()  # expect: FC107
            self.prefix_pages = n
        shared_qo_cpu = torch.tensor([0, b.num_tokens], dtype=torch.int32)
        shared_kv_cpu = torch.tensor([0, n], dtype=torch.int32)
        shared_last_cpu = torch.tensor([self.cfg.page_size], dtype=torch.int32)
        self.cascade_wrapper.plan(  # expect: FC102
            [shared_qo_cpu, b.qo_indptr], [shared_kv_cpu, b.kv_indptr_cpu], [self.prefix_indices, b.kv_indices],
            [shared_last_cpu, b.last_page_len_cpu], *self.heads)

    def plan_step(self, meta: StepMeta) -> None:
        b = meta.batch
        if meta.use_cascade:  # ok: FC101
            self.plan_cascade(meta)
        elif b.is_decode:
            args = (b.kv_indptr_cpu, b.kv_indices, b.last_page_len_cpu)
            self.decode_wrapper.plan(*args, *self.heads)  # ok: FC102
        else:
            self._plan_prefill(b.qo_indptr, b.kv_indptr_cpu, b.kv_indices, b.last_page_len_cpu, *self.heads)  # expect: FC102

    def forward_decode(self, q, layer, meta: StepMeta):
        kv = self.kv_cache[layer.layer_id]
        if meta.use_cascade:
            return self.cascade_wrapper.run(q, kv)  # expect: FC108
        return self.decode_wrapper.run(q, kv)  # expect: FC108

    def forward_extend(self, q, k, v, layer, meta: StepMeta):
        return self.prefill_wrapper.run(q, self.kv_cache[layer.layer_id])  # ok: FC108

    def describe_levels(self) -> int:
        return len(self.cascade_wrapper._batch_prefill_wrappers)  # expect: FC103
