"""FlashInfer attention backend: per-step metadata dataclasses in, ``asdict``/``astuple`` plan arguments out."""
import dataclasses
import logging
import os
from typing import Optional, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from pimeta.config import DECODE_WORKSPACE_BYTES, ServeConfig
from pimeta.metadata import DecodeMetadata, GraphBuffers, PrefillMetadata, Req

logger = logging.getLogger(__name__)


class FlashInferAttnBackend:
    decode_backend = "fa2"

    def __init__(self, cfg: ServeConfig, device: torch.device):
        assert cfg.page_size in (16, 32, 64), f"unsupported page size {cfg.page_size}"  # expect: FC109
        self.cfg, self.device = cfg, device
        self._kv_layout = "HND" if self.decode_backend == "trtllm-gen" else "NHD"  # ok: FC103
        self._plan_info: dict[int, int] = {}
        self.decode_wrapper, self.draft_wrapper = self._make_decode_wrapper(), self._make_decode_wrapper()
        ragged_ws = torch.empty(int(os.getenv("PIMETA_RAGGED_WS_MB", "256")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, self._kv_layout)
        window_ws = torch.empty(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(window_ws, self._kv_layout)
        self.bufs = GraphBuffers(cfg.max_batch_size, cfg.max_pages, device)
        self.bufs.kv_indptr.zero_()  # ok: FC104
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[DecodeMetadata | PrefillMetadata] = None
        self.out_buf: Optional[torch.Tensor] = None

    def _make_decode_wrapper(self) -> BatchDecodeWithPagedKVCacheWrapper:
        ws = torch.empty(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        return BatchDecodeWithPagedKVCacheWrapper(ws, self._kv_layout, use_tensor_cores=True)

    def _graph_workspace(self) -> torch.Tensor:
        c = self.cfg
        return torch.empty(c.max_batch_size * c.num_qo_heads * c.head_dim * 64, dtype=torch.uint8, device=self.device)  # ok: FC106

    def init_cuda_graph_state(self, batch_sizes: Sequence[int]) -> None:
        graph_ws = self._graph_workspace()
        self.bufs.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                graph_ws, self._kv_layout, use_cuda_graph=True, backend=self.decode_backend,
                paged_kv_indptr_buffer=self.bufs.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.bufs.kv_indices,
                paged_kv_last_page_len_buffer=self.bufs.kv_last_page_len[:bs])

    def init_forward_metadata(self, reqs: Sequence[Req], is_decode: bool) -> None:
        c = self.cfg
        if is_decode:
            meta = DecodeMetadata.from_requests(reqs, self.device, wrapper=self.decode_wrapper)
            self.decode_wrapper.plan(**dataclasses.asdict(meta.plan_args(c)))  # ok: FC102
            if max(meta.seq_lens_host) > c.sliding_window:  # ok: FC101
                self.window_wrapper.plan(*dataclasses.astuple(meta.plan_args(c)), window_left=c.sliding_window)  # ok: FC102
            logger.debug("decode step: %d rows, longest %s", meta.batch_size, meta.seq_lens.max())  # ok: FC101
            if meta.draft_tokens:  # ok: FC101
                self.plan_draft(meta)
        else:
            meta = PrefillMetadata.from_requests(reqs, self.device)
            self.ragged_wrapper.plan(**dataclasses.asdict(meta.build_plan_args(c)))  # expect: FC102
            if self.out_buf is None:
                self.out_buf = torch.empty(c.max_num_tokens, c.num_qo_heads, c.head_dim, dtype=torch.bfloat16, device=self.device)  # ok: FC107
            meta.last_token_rows = torch.empty(len(meta.extend_lens_host), dtype=torch.int64, device=self.device)  # ok: FC107
            torch.sub(meta.qo_indptr[1:], 1, out=meta.last_token_rows)  # ok: FC104
            self.token_to_req = meta.token_to_req
        self.forward_metadata = meta

    def plan_draft(self, meta: DecodeMetadata) -> None:
        c = self.cfg
        self.ragged_wrapper.plan(meta.qo_indptr, meta.qo_indptr_cpu, c.num_qo_heads, c.num_kv_heads, c.head_dim)  # expect: FC102
        args = dataclasses.asdict(meta.draft_plan_args(c))
        args["last_page_len"] += 1  # ok: FC104
        self.draft_wrapper.plan(**args)  # expect: FC102

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> DecodeMetadata:
        w = self.graph_wrappers[bs]
        if not getattr(w, "_use_cuda_graph", False):  # expect: FC103
            raise RuntimeError(f"bucket {bs}: wrapper is not in CUDA-graph mode")
        meta = DecodeMetadata.for_capture(self.bufs, bs, w)
        meta.kv_last_page_len.fill_(1)  # ok: FC104
        w.plan(meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, *self.cfg.plan_dims())  # expect: FC102
        self.forward_metadata = meta
        return meta

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMetadata) -> None:
        n, b = meta.batch_size, self.bufs
        assert n <= bs, f"{n} requests do not fit the {bs}-row graph"  # expect: FC109
        if torch.equal(meta.kv_indptr, b.kv_indptr[: n + 1]) and self._plan_info.get(bs) == meta.total_pages:  # expect: FC101
            return
        if meta.num_pages > b.kv_indices.numel():
            self.bufs.kv_indices = torch.empty(2 * meta.total_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        b.kv_indptr_host[: n + 1].copy_(meta.kv_indptr_cpu)  # ok: FC101
        b.kv_indptr_host[n + 1 : bs + 1] = meta.total_pages
        b.last_page_len_host[:n].copy_(meta.last_page_len_cpu)
        b.kv_indices[: meta.total_pages].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(b.kv_indptr_host[: bs + 1], b.kv_indices, b.last_page_len_host[:bs], *self.cfg.plan_dims())  # ok: FC102
        self._plan_info[bs] = meta.total_pages  # ok: FC103
        self.bufs.seq_lens = torch.cat([meta.seq_lens, b.seq_lens[n:]])  # expect: FC107
        b.kv_last_page_len[n:bs].fill_(1)  # expect: FC104

    def attend(self, q, k, v, kv_cache: torch.Tensor, sliding: bool) -> torch.Tensor:
        if isinstance(self.forward_metadata, PrefillMetadata):
            return self.forward_extend(q, k, v)
        return self.forward_decode(q, kv_cache, sliding)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, sliding: bool) -> torch.Tensor:
        if sliding:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        return self.forward_metadata.wrapper.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = self.out_buf[: self.forward_metadata.num_tokens]
        return self.ragged_wrapper.run(q, k, v, out=out)  # ok: FC108

    def forward_draft(self, q, k, v, kv_cache: torch.Tensor) -> torch.Tensor:
        ctx = self.ragged_wrapper.run(q, k, v)  # expect: FC108
        self.forward_metadata.advance_draft()
        return self.draft_wrapper.run(ctx, kv_cache)  # expect: FC108

    def warmup(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        meta = DecodeMetadata.from_requests([Req(1, [0])] * q.shape[0], self.device)
        self.decode_wrapper.plan(*dataclasses.astuple(meta.plan_args(self.cfg)))  # ok: FC102
        return self.decode_wrapper.run(q, kv_cache)  # ok: FC108
