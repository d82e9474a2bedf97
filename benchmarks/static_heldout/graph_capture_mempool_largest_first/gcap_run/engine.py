"""The engine loop around the captured graphs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from gcap.config import GraphConfig
from gcap.mempool import GraphPoolManager
from gcap.static_io import StaticIO
from gcap_attn.backend import GraphAttnBackend
from gcap_attn.metadata import DecodeMeta
from gcap_run.capturer import PoolCapturer
from gcap_run.model import SmallLM
from gcap_run.replayer import BucketReplayer

logger = logging.getLogger(__name__)


@dataclass
class HostBatch:
    """What the scheduler hands over: numpy arrays only."""

    batch_size: int
    num_tokens: int
    is_verify: bool
    token_ids: np.ndarray
    positions: np.ndarray
    out_loc: np.ndarray
    q_lens: np.ndarray
    seq_lens: np.ndarray
    page_lists: List[np.ndarray]
    temperatures: np.ndarray


@dataclass
class StepBatch:
    batch_size: int
    num_tokens: int
    is_verify: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_loc: torch.Tensor
    q_lens: torch.Tensor
    temperatures: torch.Tensor
    meta: DecodeMeta


class GraphEngine:
    def __init__(self, cfg: GraphConfig, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.copy_stream = torch.cuda.Stream(self.device)
        self._row_ids_eager = torch.arange(cfg.eager_max_bs, device=self.device)

    def setup(self, num_pages: int) -> None:
        cfg, dev = self.cfg, self.device
        self.io = StaticIO(cfg, dev)
        self.kv_cache = torch.zeros(
            cfg.num_layers, num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=cfg.dtype, device=dev
        )
        self.backend = GraphAttnBackend(cfg, self.io, self.kv_cache, dev)
        self.backend.init_graph_wrappers(cfg.buckets)
        self.model = SmallLM(cfg, self.backend).to(dev, dtype=cfg.dtype)
        self.pool_mgr = GraphPoolManager(dev)
        graphs = PoolCapturer(self.model, self.backend, self.io, self.pool_mgr, cfg, dev).capture_all()
        self.replayer = BucketReplayer(graphs, self.backend, self.io, cfg, self.copy_stream)

    # --------------------------------------------------------------- helpers

    def _upload(self, hb: HostBatch) -> StepBatch:
        dev, page = self.device, self.cfg.page_size

        def up(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).pin_memory().to(dev, non_blocking=True)

        pages = (hb.seq_lens + page - 1) // page
        indptr = np.zeros(hb.batch_size + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        flat = np.concatenate([pl[:n] for pl, n in zip(hb.page_lists, pages)]).astype(np.int32)
        table = np.zeros((hb.batch_size, int(pages.max())), dtype=np.int32)
        for i, (pl, n) in enumerate(zip(hb.page_lists, pages)):
            table[i, :n] = pl[:n]
        qo = np.zeros(hb.batch_size + 1, dtype=np.int32)
        np.cumsum(hb.q_lens, out=qo[1:])
        seq_lens_cpu = torch.from_numpy(hb.seq_lens.astype(np.int32)).pin_memory()
        meta = DecodeMeta(
            batch_size=hb.batch_size,
            num_tokens=hb.num_tokens,
            max_seq_len=int(hb.seq_lens.max()),
            is_verify=hb.is_verify,
            seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            row_ids=self._row_ids_eager[: hb.batch_size],
            page_lists=hb.page_lists,
            block_table=up(table),
            kv_indices=up(flat),
            kv_indptr_host=torch.from_numpy(indptr),
            kv_last_page_len_host=torch.from_numpy(((hb.seq_lens - 1) % page + 1).astype(np.int32)),
            qo_indptr_host=torch.from_numpy(qo),
        )
        return StepBatch(
            batch_size=hb.batch_size,
            num_tokens=hb.num_tokens,
            is_verify=hb.is_verify,
            input_ids=up(hb.token_ids.astype(np.int64)),
            positions=up(hb.positions.astype(np.int64)),
            out_loc=up(hb.out_loc.astype(np.int64)),
            q_lens=up(hb.q_lens.astype(np.int64)),
            temperatures=up(hb.temperatures.astype(np.float32)),
            meta=meta,
        )

    def _grow_static(self, num_tokens: int, bs: int) -> None:
        """Eager batches larger than every bucket stage their positions in the static buffer too."""
        if num_tokens > self.io.positions.numel():
            extra = num_tokens - self.io.positions.numel()
            self.io.positions = torch.cat([self.io.positions, self.io.positions.new_zeros(extra)])  # expect: FC107
        if bs > self.io.seq_lens_host.numel():
            self.io.seq_lens_host = torch.ones(bs, dtype=torch.int32, pin_memory=True)  # ok: FC107

    def _token_rows(self, batch: StepBatch) -> torch.Tensor:
        return torch.repeat_interleave(self._row_ids_eager[: batch.batch_size], batch.q_lens)  # expect: FC101

    def _eager_step(self, batch: StepBatch) -> torch.Tensor:
        positions = self.io.positions[: batch.num_tokens]
        positions.copy_(batch.positions, non_blocking=True)
        self.backend.prepare_eager(batch.batch_size, batch.meta)
        logits = self.model.forward_decode(batch.input_ids, positions, batch.out_loc, batch.meta)
        temps = batch.temperatures[self._token_rows(batch)]
        return logits / temps.clamp_min(1e-5).unsqueeze(-1)

    # ------------------------------------------------------------------ step

    def decode_step(self, hb: HostBatch) -> torch.Tensor:
        bs = hb.batch_size
        if hb.num_tokens > self.io.positions.numel() or bs > self.io.seq_lens_host.numel():
            self._grow_static(hb.num_tokens, bs)
        with torch.cuda.stream(self.copy_stream):
            batch = self._upload(hb)
        self.copy_stream.synchronize()  # expect: FC101
        if bs > self.cfg.buckets[-1]:
            return self._eager_step(batch)

        padded = self.replayer.bucket_for(bs)
        rows = self.replayer.prepare_inputs(bs, padded, batch)
        if batch.is_verify:
            self.backend.prepare_verify(bs, batch.meta)
            logits = self.replayer.replay("verify", bs, padded)
        else:
            self.backend.prepare_replay(bs, padded, batch.meta)
            self.replayer.pad_rows(bs, padded)
            logits = self.replayer.replay("decode", bs, padded)
        return logits / batch.temperatures[rows].clamp_min(1e-5).unsqueeze(-1)
