"""Captures decode and verify graphs per bucket, largest first, into the one shared pool."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np
import torch

from gcap.buckets import largest_first
from gcap.config import GraphConfig
from gcap.mempool import GraphPoolManager
from gcap.static_io import BucketView, StaticIO
from gcap_attn.backend import GraphAttnBackend
from gcap_attn.metadata import DecodeMeta
from gcap_run.model import SmallLM

logger = logging.getLogger(__name__)

_GRAPH_BUF_FIELDS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")


@dataclass
class CapturedBucket:
    graph: torch.cuda.CUDAGraph
    kind: str
    bs: int
    num_tokens: int
    logits: torch.Tensor


class PoolCapturer:
    def __init__(
        self,
        model: SmallLM,
        backend: GraphAttnBackend,
        io: StaticIO,
        pool_mgr: GraphPoolManager,
        cfg: GraphConfig,
        device: torch.device,
    ) -> None:
        self.model = model
        self.backend = backend
        self.io = io
        self.pool_mgr = pool_mgr
        self.cfg = cfg
        self.device = device
        self.graphs: Dict[Tuple[str, int], CapturedBucket] = {}

    def capture_all(self) -> Dict[Tuple[str, int], CapturedBucket]:
        torch.cuda.synchronize(self.device)  # ok: FC101
        stream = torch.cuda.Stream(self.device)
        for bs in largest_first(self.cfg.buckets):
            before = self.pool_mgr.used_bytes()
            self.graphs[("decode", bs)] = self._capture_decode(bs, stream)
            self.pool_mgr.release_unused()
            mid = self.pool_mgr.used_bytes()
            self.pool_mgr.record(f"decode/{bs}", before, mid)
            self.graphs[("verify", bs)] = self._capture_verify(bs, stream)
            self.pool_mgr.release_unused()
            self.pool_mgr.record(f"verify/{bs}", mid, self.pool_mgr.used_bytes())
        self._check_buffer_addresses()
        torch.cuda.synchronize(self.device)
        logger.info("captured %s", self.pool_mgr.summary())
        return self.graphs

    # ----------------------------------------------------------------- helpers

    def _dummy_meta(self, bs: int, verify: bool) -> DecodeMeta:
        """Every row: a short sequence on the null page."""
        q_len = self.cfg.verify_len if verify else 1
        lens = np.full(bs, q_len, dtype=np.int32)
        last = (lens - 1) % self.cfg.page_size + 1
        return DecodeMeta(
            batch_size=bs,
            num_tokens=bs * q_len,
            max_seq_len=q_len,
            is_verify=verify,
            seq_lens=self.io.seq_lens[:bs],
            seq_lens_cpu=torch.from_numpy(lens),
            row_ids=torch.arange(bs, device=self.device),
            page_lists=[np.zeros(1, dtype=np.int32) for _ in range(bs)],
            block_table=torch.zeros(bs, 1, dtype=torch.int32, device=self.device),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
            kv_indptr_host=torch.arange(bs + 1, dtype=torch.int32),
            kv_last_page_len_host=torch.from_numpy(last.astype(np.int32)),
            qo_indptr_host=self.io.qo_indptr_host[: bs + 1],
        )

    def _warmup(self, view: BucketView, meta: DecodeMeta, stream: torch.cuda.Stream) -> None:
        # warm up on full pages so every split-k path of the kernel gets built before capture
        view.kv_last_page_len.fill_(self.cfg.page_size)  # expect: FC104
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.cfg.num_warmups):
                self.model.forward_decode(view.input_ids, view.positions, view.out_loc, meta)
        torch.cuda.current_stream().wait_stream(stream)

    def _capture_decode(self, bs: int, stream: torch.cuda.Stream) -> CapturedBucket:
        view = self.io.view(bs)
        meta = self._dummy_meta(bs, verify=False)
        self.backend.prepare_replay(bs, bs, meta)
        self._warmup(view, meta, stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool_mgr.acquire(), stream=stream):
            logits = self.model.forward_decode(view.input_ids, view.positions, view.out_loc, meta)
        return CapturedBucket(graph=graph, kind="decode", bs=bs, num_tokens=bs, logits=logits)

    def _capture_verify(self, bs: int, stream: torch.cuda.Stream) -> CapturedBucket:
        view = self.io.view(bs, self.cfg.verify_len)
        meta = self._dummy_meta(bs, verify=True)
        self.backend.prepare_verify(bs, meta)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(self.cfg.num_warmups):
                self.model.forward_verify(view, meta)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool_mgr.acquire(), stream=stream):
            hidden = self.model.forward_verify(view, meta)
            n_tok = int(view.qo_indptr[-1])  # expect: FC101
            logits = self.model.lm_head(hidden[:n_tok])
        return CapturedBucket(graph=graph, kind="verify", bs=bs, num_tokens=n_tok, logits=logits)

    def _check_buffer_addresses(self) -> None:
        """Every bucket wrapper must read the shared static buffers: one pool, one set of addresses."""
        shared = {self.io.kv_indptr.data_ptr(), self.io.kv_indices.data_ptr(), self.io.kv_last_page_len.data_ptr()}
        for bs, w in self.backend.graph_decode.items():
            for name in _GRAPH_BUF_FIELDS:
                ptr = getattr(w, name).data_ptr()  # expect: FC103
                if ptr not in shared:
                    raise RuntimeError(f"bucket {bs}: {name} does not alias the shared static buffer")
