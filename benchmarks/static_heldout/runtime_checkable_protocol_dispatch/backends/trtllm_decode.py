from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from rcengine.batch import StepMeta
from rcengine.config import ServeConfig
from rcengine.workspaces import get_trtllm_workspace, xqa_scratch


class TrtllmDecodeBackend:
    """trtllm-gen decode for Blackwell. Satisfies AttentionImpl, SupportsEagerPlan and SupportsCudaGraph;
    prefill stays on the paged backend."""

    def __init__(self, cfg: ServeConfig, kv_cache):
        self.cfg, self.kv_cache, self.device = cfg, kv_cache, torch.device(cfg.device)
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._backend = "trtllm-gen"  # ok: FC103
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(get_trtllm_workspace(cfg.device), "HND", backend=self._backend)
        self.mtp_workspace = torch.empty(cfg.max_tokens * 4096, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.mtp_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.mtp_workspace, "HND", backend="trtllm-gen")
        self.verify_workspace = torch.empty(cfg.max_tokens * 4096, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.verify_workspace.zero_()
        self.verify_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.verify_workspace, "HND", backend="trtllm-gen")
        pages_per_req = cfg.total_pages // cfg.max_batch
        self.block_tables = torch.zeros(cfg.max_batch, pages_per_req, dtype=torch.int32, device=self.device)
        self.t_seq_lens = torch.zeros(cfg.max_batch, dtype=torch.int32, device=self.device)
        self.t_indptr = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=self.device)
        self.t_last_page_len = torch.ones(cfg.max_batch, dtype=torch.int32, device=self.device)
        self.seq_lens_host = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_workspace = None
        self.use_xqa = cfg.page_size == 64
        self.max_seq_len = 0

    def plan_step(self, meta: StepMeta) -> None:
        b = meta.batch
        self.seq_lens_host[: b.batch_size].copy_(b.seq_lens_cpu)  # ok: FC101
        kw = dict(last_page_len=b.last_page_len, page_size=self.cfg.page_size)
        self.eager_wrapper.plan(  # expect: FC102
            b.kv_indptr_cpu, b.kv_indices, num_qo_heads=self.cfg.num_qo_heads, num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim, **kw)
        self.mtp_wrapper.plan(b.kv_indptr_cpu, b.kv_indices, b.last_page_len_cpu, *self.heads)  # ok: FC102

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.graph_workspace = torch.zeros(max_bs * self.cfg.num_qo_heads * 8192, dtype=torch.uint8, device=self.device)  # ok: FC106

    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta: StepMeta) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, "HND", use_cuda_graph=True, backend="trtllm-gen",
            paged_kv_indptr_buffer=self.t_indptr[: bs + 1], paged_kv_indices_buffer=self.block_tables.view(-1),
            paged_kv_last_page_len_buffer=self.t_last_page_len[:bs])
        w.plan(self.t_indptr[: bs + 1], self.block_tables.view(-1), meta.padded_last_page_len_cpu[:bs], *self.heads)  # expect: FC102
        self.graph_wrappers[bs] = w

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: StepMeta) -> None:
        b, real = meta.batch, meta.batch.batch_size
        self.max_seq_len = max(b.seq_lens)  # expect: FC101
        self.t_seq_lens.resize_(bs)  # expect: FC107
        self.t_seq_lens[:real].copy_(b.seq_lens, non_blocking=True)
        self.t_indptr[: real + 1].copy_(b.kv_indptr, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            meta.padded_kv_indptr_cpu[: bs + 1], b.kv_indices, meta.padded_last_page_len_cpu[:bs], *self.heads)

    def forward_decode(self, q, layer, meta: StepMeta):
        kv = self.kv_cache[layer.layer_id]
        bs = meta.graph_bs
        if bs is not None and bs in self.graph_wrappers:
            return self.graph_wrappers[bs].run(q, kv)  # ok: FC108
        if self.use_xqa:
            real = meta.batch.batch_size
            torch.cumsum(self.t_seq_lens[:real] // self.cfg.page_size, 0, out=self.t_indptr[1 : real + 1])  # expect: FC104
            return trtllm_batch_decode_with_kv_cache(
                q, kv, xqa_scratch(self.cfg), self.block_tables[:real], self.t_seq_lens[:real], self.max_seq_len)
        return self.eager_wrapper.run(q, kv)  # expect: FC108

    def forward_extend(self, q, k, v, layer, meta: StepMeta):
        raise NotImplementedError("trtllm-gen serves decode only; extend batches go to the paged backend")
