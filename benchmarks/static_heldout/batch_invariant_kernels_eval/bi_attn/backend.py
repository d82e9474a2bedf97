from typing import Dict

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from bieval import InvariantConfig
from bi_attn.metadata import StepMeta
from bi_attn.plans import invariant_kwargs, plan_prefill_fixed
from bi_attn.workspace import graph_workspace, prefill_workspace, swa_workspace


class InvariantBackend:
    """Decode rows run the prefill kernel too (tensor cores, fixed split), so a
    request computes the same reduction alone and in any batch."""

    def __init__(self, cfg: InvariantConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self._backend = "fa2"
        max_bs = max(cfg.buckets)
        self.qo_indptr_buf = torch.arange(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.qo_host = torch.arange(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        ws = graph_workspace(cfg)
        self.decode_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        for bs in cfg.buckets:
            self.decode_wrappers[bs] = BatchPrefillWithPagedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=True, backend=self._backend,
                qo_indptr_buf=self.qo_indptr_buf[: bs + 1], paged_kv_indptr_buf=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buf=self.kv_indices_buf, paged_kv_last_page_len_buf=self.last_page_buf[:bs])
        self.eager: Dict[str, BatchPrefillWithPagedKVCacheWrapper] = {
            "full": BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(cfg), "NHD", backend="fa2"),
            "swa": BatchPrefillWithPagedKVCacheWrapper(swa_workspace(cfg), "NHD", backend="trtllm-gen"),
        }

    @property
    def backend_name(self) -> str:
        return self._backend  # ok: FC103

    def init_graph_buffers(self) -> None:
        self.kv_indptr_buf.zero_()
        self.last_page_buf.fill_(1)  # ok: FC104

    def _head_args(self):
        c = self.cfg
        return (c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size)

    def _plan_swa(self, meta: StepMeta, seq_lens: torch.Tensor) -> None:
        plan_fn = self.eager["swa"].plan
        plan_fn(meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_cpu, *self._head_args(),  # expect: FC102
                causal=True, window_left=self.cfg.sliding_window - 1, q_data_type=self.cfg.dtype, seq_lens=seq_lens)

    def init_forward_metadata(self, meta: StepMeta) -> None:
        """Steps with prompt rows run eagerly on the same fixed-split kernels."""
        plan_prefill_fixed(self.eager["full"], meta, self.cfg, self.cfg.fixed_split_pages * self.cfg.page_size)
        self._plan_swa(meta, meta.seq_lens)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, meta: StepMeta) -> None:
        self.decode_wrappers[bs].plan(meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_cpu,  # ok: FC102
                                      *self._head_args(), causal=True, q_data_type=self.cfg.dtype,
                                      **invariant_kwargs(self.cfg))
        self._plan_swa(meta, meta.seq_lens_cpu)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: StepMeta) -> None:
        n, total = meta.num_reqs, meta.num_pages
        self.kv_indices_buf[:total].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        qo, kv, last = self.qo_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.last_host[:bs]
        kv[: n + 1].copy_(meta.kv_indptr_cpu)
        kv[n + 1 :] = meta.kv_indptr_cpu[n]
        last[:n].copy_(meta.last_page_cpu)
        last[n:] = 1
        self.decode_wrappers[bs].plan(qo, kv, self.kv_indices_buf[:total], last, *self._head_args(),  # ok: FC102
                                      causal=True, q_data_type=self.cfg.dtype, **invariant_kwargs(self.cfg))
        self._plan_swa(meta, meta.seq_lens_cpu)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int, bucket) -> torch.Tensor:
        if layer_id % self.cfg.swa_every == 1:
            return self.eager["swa"].run(q, kv_cache)  # expect: FC108
        w = self.eager["full"] if bucket is None else self.decode_wrappers[bucket]
        return w.run(q, kv_cache)  # ok: FC108
