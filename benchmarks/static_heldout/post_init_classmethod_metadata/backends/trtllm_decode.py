"""trtllm-gen decode (HND cache) with a speculative verify wrapper; prefill stays on the FA2 ragged wrapper."""
import dataclasses
import math

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from pimeta.config import TRTLLM_DECODE_WORKSPACE_BYTES, ServeConfig, sm_scratch_bytes
from pimeta.metadata import DecodeMetadata, Req

from .flashinfer_backend import FlashInferAttnBackend


@dataclasses.dataclass
class TrtllmWorkspaces:
    """The trtllm-gen kernels keep semaphores and multi-CTA counters in these buffers."""

    graph: torch.Tensor = dataclasses.field(
        default_factory=lambda: torch.zeros(TRTLLM_DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"))  # expect: FC106
    xqa: torch.Tensor = dataclasses.field(
        default_factory=lambda: torch.empty(sm_scratch_bytes(), dtype=torch.uint8, device="cuda"))  # expect: FC105
    verify: torch.Tensor = dataclasses.field(
        default_factory=lambda: torch.zeros(sm_scratch_bytes(), dtype=torch.uint8, device="cuda"))  # ok: FC105


class TrtllmDecodeBackend(FlashInferAttnBackend):
    decode_backend = "trtllm-gen"

    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.ws = TrtllmWorkspaces()
        super().__init__(cfg, device)
        self._sm_scale = cfg.head_dim ** -0.5  # ok: FC103
        self.cache_layout = self.decode_wrapper._kv_layout  # expect: FC103
        draft_ws = torch.zeros(cfg.DRAFT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(draft_ws, "HND", backend=self.decode_backend)
        self.verify_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.ws.verify, "HND", backend=self.decode_backend)
        self.k_scale = torch.ones((), dtype=torch.float32, device=device)
        self.max_kv_len_limit = cfg.max_pages * cfg.page_size
        self.capturing, self.max_kv_len, self.bmm1_scale = False, 0, self._sm_scale

    def _make_decode_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        ws = torch.empty(self.cfg.workspace_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
        return BatchDecodeWithPagedKVCacheWrapper(ws, "HND", backend=self.decode_backend)

    def _graph_workspace(self) -> torch.Tensor:
        return self.ws.graph

    def _verify_bytes(self, rows: int) -> int:
        assert rows > 0, "verify planned for an empty batch"  # ok: FC109
        return rows * (self.cfg.num_draft_tokens + 1) * self.cfg.num_qo_heads * 4096

    def init_forward_metadata(self, reqs: list[Req], is_decode: bool) -> None:
        super().init_forward_metadata(reqs, is_decode)
        meta, c = self.forward_metadata, self.cfg
        if not is_decode:
            return
        if math.ceil(max(meta.seq_lens_host) / c.page_size) > c.max_pages:  # ok: FC101
            raise ValueError("a request needs more pages than the pool holds")
        self.max_kv_len = max(meta.seq_lens)  # expect: FC101
        self.bmm1_scale = float(self.k_scale) * self._sm_scale  # expect: FC101
        if c.num_draft_tokens:
            need = self._verify_bytes(meta.batch_size)
            if need > self.ws.verify.numel():
                self.ws.verify = torch.zeros(need, dtype=torch.uint8, device=self.device)  # expect: FC107
            args = dataclasses.replace(meta.plan_args(c), last_page_len=meta.kv_last_page_len)
            self.verify_wrapper.plan(*dataclasses.astuple(args))  # expect: FC102

    def plan_draft(self, meta: DecodeMetadata) -> None:
        self.draft_wrapper.plan(meta.kv_indptr, meta.kv_indices, meta.last_page_len_cpu, *self.cfg.plan_dims())  # expect: FC102

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> DecodeMetadata:
        self.capturing = True
        meta = super().init_forward_metadata_capture_cuda_graph(bs)
        dummy_indptr = torch.arange(bs + 1, dtype=torch.int32)
        self.verify_wrapper.plan(dummy_indptr, meta.kv_indices, torch.ones(bs, dtype=torch.int32), *self.cfg.plan_dims())  # ok: FC102
        return meta

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMetadata) -> None:
        self.capturing = False
        if (meta.kv_last_page_len > self.cfg.page_size).any():  # expect: FC101
            raise ValueError("last-page lengths exceed the page size")
        if meta.total_pages > self.bufs.kv_indices.numel():  # ok: FC101
            self.bufs.kv_indices.resize_(meta.total_pages)  # expect: FC107
        super().init_forward_metadata_replay_cuda_graph(bs, meta)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, sliding: bool) -> torch.Tensor:
        meta = self.forward_metadata
        if meta.batch_size > max(self.graph_wrappers, default=0):  # ok: FC101
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.ws.xqa, meta.block_tables, meta.seq_lens, self.max_kv_len,
                bmm1_scale=self.bmm1_scale, bmm2_scale=1.0)
        w = self.graph_wrappers.get(meta.batch_size) if self.capturing else self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_verify(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        seq_lens = self.forward_metadata.seq_lens
        if int(seq_lens.max()) + self.cfg.num_draft_tokens > self.max_kv_len_limit:  # expect: FC101
            raise ValueError(f"draft tokens would overflow the KV budget: {seq_lens}")  # ok: FC101
        return self.verify_wrapper.run(q, kv_cache)  # expect: FC108
