"""Two FlashInfer wrapper families per decode bucket: decoder self-attention over the paged self KV and
cross-attention over the cached encoder pages; a ragged prefill wrapper for the encoder."""

import functools
from typing import Callable, Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, merge_state
from flashinfer.decode import fast_decode_plan

from t5serve import CrossKVStore, DecoderBatch, T5Config

from .recent import recent_attention
from .workspace import encoder_workspace, graph_workspace, long_cross_workspace


def _force_layout(target, layout: str) -> None:
    """Encoder pages are written HND by the fused projection; point a cross wrapper at that layout."""
    target._kv_layout = layout  # expect: FC103


class EncDecBackend:
    def __init__(self, cfg: T5Config, store: CrossKVStore, device):
        self.cfg = cfg
        self.store = store
        self.device = device
        self._plan_info: Dict[int, dict] = {}  # ok: FC103
        self.graph_ws = graph_workspace(cfg, device)
        self.encoder_prefill = BatchPrefillWithRaggedKVCacheWrapper(encoder_workspace(device), "NHD", backend="fa2")
        self.long_cross = BatchDecodeWithPagedKVCacheWrapper(long_cross_workspace(cfg, device), "HND",
                                                             use_tensor_cores=True)
        self._plan_fn = fast_decode_plan
        self.self_kv = torch.zeros((cfg.num_decoder_layers, cfg.self_pages, 2, cfg.page_size, cfg.num_heads,
                                    cfg.head_dim), dtype=cfg.dtype, device=device)
        max_bs = max(cfg.buckets)
        max_self = max_bs * (cfg.max_enc_len // cfg.page_size)
        max_cross = max_bs * (cfg.cross_cap_tokens // cfg.page_size)
        self.self_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.self_indices_buf = torch.zeros(max_self, dtype=torch.int32, device=device)
        self.self_last_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.cross_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.cross_indices_buf = torch.zeros(max_cross, dtype=torch.int32, device=device)
        self.cross_last_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.indptr_pinned = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.cross_last_pinned = torch.full((cfg.max_batch,), cfg.page_size, dtype=torch.int32, pin_memory=True)
        self.long_row_mask = torch.zeros(cfg.max_batch, dtype=torch.bool, device=device)
        self.has_long_rows = False
        self.self_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.cross_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._layout_fixers: Dict[int, Callable[[str], None]] = {}
        self._heads = dict(num_qo_heads=cfg.num_heads, num_kv_heads=cfg.num_heads, head_dim=cfg.head_dim,
                           page_size=cfg.page_size, sm_scale=1.0, q_data_type=cfg.dtype)

    def init_graph_buffers(self) -> None:
        self.cross_last_buf.fill_(self.cfg.page_size)  # ok: FC104
        for bs in self.cfg.buckets:
            self.self_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True, backend="fa2",
                paged_kv_indptr_buffer=self.self_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.self_indices_buf,
                paged_kv_last_page_len_buffer=self.self_last_buf[:bs])
            cw = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, backend="trtllm-gen",
                paged_kv_indptr_buffer=self.cross_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.cross_indices_buf,
                paged_kv_last_page_len_buffer=self.cross_last_buf[:bs])
            self.cross_wrappers[bs] = cw
            self._layout_fixers[bs] = functools.partial(_force_layout, cw)
        for fix in self._layout_fixers.values():
            fix("HND")

    def prepare_capture(self, bs: int) -> None:
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = torch.ones(bs, dtype=torch.int32)
        self.self_wrappers[bs].plan(indptr_cpu, self.self_indices_buf[:bs], last_cpu, **self._heads)  # ok: FC102
        self.cross_wrappers[bs].plan(indptr_cpu, self.cross_indices_buf[:bs], last_cpu, **self._heads)
        self.long_cross.plan(indptr_cpu, self.cross_indices_buf[:bs], last_cpu, **self._heads)

    def plan_encoder(self, cu_lens_cpu: torch.Tensor) -> None:
        cfg = self.cfg
        self.encoder_prefill.plan(cu_lens_cpu, cu_lens_cpu, cfg.num_heads, cfg.num_heads, cfg.head_dim,  # ok: FC102
                                  causal=False, sm_scale=1.0, q_data_type=cfg.dtype)

    def plan_decode_step(self, bs: int, batch: DecoderBatch, slots: torch.Tensor) -> None:
        bs_real = batch.batch_size
        n_self = int(batch.self_indptr_cpu[-1])
        max_enc = int(batch.enc_lens_cpu.max())  # ok: FC101
        self.indptr_pinned[: bs_real + 1].copy_(batch.self_indptr_cpu)
        self.indptr_pinned[bs_real + 1 : bs + 1] = n_self
        self.self_indices_buf[:n_self].copy_(batch.self_indices, non_blocking=True)
        self._plan_fn(self.self_wrappers[bs], self.indptr_pinned[: bs + 1], self.self_indices_buf[:n_self], last_page_len=batch.self_last_page_len,  # expect: FC102
                      **self._heads)
        cross_np = self.store.cross_indices_np(batch.slots_cpu)
        m = len(cross_np)
        self.cross_indices_buf[:m].copy_(torch.from_numpy(cross_np).to(self.device, non_blocking=True))  # ok: FC104
        cross_indptr = self.store.cross_indptr(slots)
        self.cross_wrappers[bs].plan(cross_indptr, self.cross_indices_buf[:m], self.cross_last_pinned[:bs], **self._heads)  # expect: FC102
        self.has_long_rows = max_enc > self.cfg.cross_cap_tokens
        if self.has_long_rows:
            self.long_cross.plan(batch.cross_indptr_cpu, self.cross_indices_buf[:m], self.cross_last_pinned[:bs_real],
                                 **self._heads)
        # the bound indptr follows the device page counts of the cached encoder outputs
        torch.cumsum(self.store.enc_pages_dev.index_select(0, slots), 0, out=self.cross_indptr_buf[1 : bs_real + 1])  # expect: FC104
        self._plan_info[bs] = {"rows": bs_real, "self_pages": n_self, "cross_pages": m}

    # -------------------------------------------------------------- forward
    def write_self_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        flat = self.self_kv[layer].transpose(1, 2).reshape(-1, 2, self.cfg.num_heads, self.cfg.head_dim)
        flat.index_copy_(0, out_loc, torch.stack([k, v], dim=1))

    def self_attend(self, layer: int, q: torch.Tensor, bs: int, bias_rows: torch.Tensor, recent_slots: torch.Tensor):
        o_far, lse_far = self.self_wrappers[bs].run(q, self.self_kv[layer], return_lse=True)
        o_rec, lse_rec = recent_attention(q, self.self_kv[layer], recent_slots[:bs], bias_rows[:bs])
        o, _ = merge_state(o_far, lse_far, o_rec, lse_rec)
        return o

    def cross_attend(self, layer: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        o = self.cross_wrappers[bs].run(q, self.store.cross_kv[layer])  # ok: FC108
        if self.has_long_rows:
            o_long = self.long_cross.run(q, self.store.cross_kv[layer])  # expect: FC108
            o = torch.where(self.long_row_mask[:bs].view(bs, 1, 1), o_long, o)
        return o
