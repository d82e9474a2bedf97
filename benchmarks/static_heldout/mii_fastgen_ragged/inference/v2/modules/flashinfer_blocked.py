"""FlashInfer-backed blocked attention: ragged prefill over paged KV plus decode, eager or per graph bucket."""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from ..ragged import RaggedView
from .registry import AttnAtoms, DSAttentionRegistry, DSSelfAttentionBase, DSSelfAttentionConfig

_PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


@DSAttentionRegistry.register_module
class FlashInferBlockedAttention(DSSelfAttentionBase):
    name = "flashinfer_blocked"

    def __init__(self, config: DSSelfAttentionConfig, device: torch.device, decode_backend: Optional[str] = None):
        backend = decode_backend or ("trtllm-gen" if torch.cuda.get_device_capability(device)[0] >= 10 else "fa2")
        super().__init__(config, backend)
        self.device = device
        ws_bytes = self.decode_workspace_bytes(config)
        self.prefill_ws = torch.empty(_PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_ws = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.graph_ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD", backend="fa2")
        self.decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", backend=backend)
        self._jit_ready = getattr(self.prefill, "_cached_module", None) is not None  # expect: FC103
        self._graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._planned: Dict[int, bytes] = {}

    @staticmethod
    def decode_workspace_bytes(config: DSSelfAttentionConfig) -> int:
        per_token = config.num_heads * (config.head_size + 1) * 4
        return max(64 << 20, 8 * config.max_tokens * per_token)

    def _plan_kwargs(self) -> dict:
        c = self.config
        return dict(num_qo_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_size,
                    page_size=c.block_size, q_data_type=c.dtype, kv_data_type=c.dtype)

    def init_graph_state(self, buckets: Sequence[int]) -> None:
        c, top = self.config, max(buckets)
        self._g_indptr = torch.zeros(top + 1, dtype=torch.int32, device=self.device)
        self._g_indices = torch.zeros(c.max_seqs * c.max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self._g_last = torch.empty(top, dtype=torch.int32, device=self.device)
        self._g_indptr_host = torch.zeros(top + 1, dtype=torch.int32, pin_memory=True)
        self._g_last_host = torch.ones(top, dtype=torch.int32, pin_memory=True)
        for b in buckets:
            self._graph_decode[b] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self._g_indptr[: b + 1],
                paged_kv_indices_buffer=self._g_indices, paged_kv_last_page_len_buffer=self._g_last[:b],
                backend=self._backend)
        self._g_last.fill_(1)  # ok: FC104
        if not self._jit_ready:
            for b, w in self._graph_decode.items():
                w.plan(torch.arange(b + 1, dtype=torch.int32), torch.arange(b, dtype=torch.int32),  # ok: FC102
                       torch.ones(b, dtype=torch.int32), **self._plan_kwargs())

    def plan_graph_decode(self, bucket: int, view: RaggedView, num_decode: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = self._graph_decode[bucket]
        total = int(view.kv_indptr_host[num_decode])
        self._g_indptr_host[: num_decode + 1] = view.kv_indptr_host[: num_decode + 1]
        self._g_indptr_host[num_decode + 1 : bucket + 1] = total
        self._g_last_host[:num_decode] = view.kv_last_page_len_host[:num_decode]
        self._g_last_host[num_decode:bucket] = 1
        self._g_indices[:total].copy_(view.kv_indices[:total], non_blocking=True)  # ok: FC104
        key = self._g_indptr_host[: bucket + 1].numpy().tobytes()  # ok: FC101
        if w._plan_info is not None and self._planned.get(bucket) == key:  # expect: FC103
            return w
        w.plan(self._g_indptr_host[: bucket + 1], self._g_indices[:total],  # ok: FC102
               self._g_last_host[:bucket], **self._plan_kwargs())
        self._planned[bucket] = key
        # padded rows must not attend to anything
        self._g_last[num_decode:bucket].zero_()  # expect: FC104
        return w

    def remap_blocks(self, old_to_new: torch.Tensor) -> None:
        """The engine compacted the KV pool between steps: rewrite every cached block id."""
        self._g_indices.copy_(old_to_new[self._g_indices.long()])  # expect: FC104

    def _plan_prefill(self, view: RaggedView, num_decode: int) -> None:
        qo = view.qo_indptr_host[num_decode:] - view.qo_indptr_host[num_decode]
        kv = view.kv_indptr_host[num_decode:] - view.kv_indptr_host[num_decode]
        start = int(view.kv_indptr_host[num_decode])
        last_page_len = (view.seq_lens[num_decode:] - 1) % self.config.block_size + 1
        c = self.config
        self.prefill.plan(qo, kv, view.kv_indices[start:], last_page_len,  # expect: FC102
                          c.num_heads, c.num_kv_heads, c.head_size, c.block_size, causal=True)

    def _plan_eager_decode(self, view: RaggedView, num_decode: int) -> BatchDecodeWithPagedKVCacheWrapper:
        kv_indptr = view.kv_indptr_host[: num_decode + 1].to(self.device, non_blocking=True)
        self.decode.plan(kv_indptr, view.kv_indices, view.kv_last_page_len_host[:num_decode],  # expect: FC102
                         **self._plan_kwargs())
        return self.decode

    def build_atoms(self, view: RaggedView, bucket: Optional[int]) -> AttnAtoms:
        # the scheduler puts decode sequences (one token each) first
        num_decode = sum(1 for c in view.token_counts if c == 1)  # ok: FC101
        num_prefill = view.num_seqs - num_decode
        if num_prefill:
            self._plan_prefill(view, num_decode)
        if bucket is not None:
            decode = self.plan_graph_decode(bucket, view, num_decode)
            num_decode = bucket
        else:
            decode = self._plan_eager_decode(view, num_decode)
        max_seq_len = view.seq_lens.max().item()  # expect: FC101
        return AttnAtoms(num_decode, num_prefill, decode, max_seq_len)

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, atoms: AttnAtoms) -> torch.Tensor:
        out = torch.empty_like(q)
        nd = atoms.num_decode_tokens
        if atoms.num_prefill_seqs:
            out[nd:] = self.prefill.run(q[nd:], kv_cache)  # expect: FC108
        out[:nd] = atoms.decode_wrapper.run(q[:nd], kv_cache)  # ok: FC108
        return out
