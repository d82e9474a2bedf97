"""Per-bucket CUDA graphs. Each bucket gets a ``(prepare, launch)`` pair from ``make_graph_fns`` and a
``run(batch)`` closure from ``make_graph_step``; the runner only keeps them in dicts keyed by batch size."""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional

import torch

from cfserve.attention import make_decode_attend, make_window_attend
from cfserve.batch import ForwardBatch, dummy_batch
from cfserve.config import EngineConfig
from cfserve.instrument import cuda_timed
from cfserve.wrappers import make_graph_wrapper_cache, window_decode_wrapper

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class GraphBuffers:
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor


def init_graph_buffers(cfg: EngineConfig, device: torch.device) -> GraphBuffers:
    max_bs = max(cfg.graph_buckets())
    bufs = GraphBuffers(
        input_ids=torch.zeros(max_bs, dtype=torch.int64, device=device),
        positions=torch.zeros(max_bs, dtype=torch.int64, device=device),
        out_cache_loc=torch.zeros(max_bs, dtype=torch.int64, device=device),
        seq_lens=torch.ones(max_bs, dtype=torch.int32, device=device),
        kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
        kv_indices=torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device),
        last_page_len=torch.empty(max_bs, dtype=torch.int32, device=device),
        kv_indptr_cpu=torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
        last_page_len_cpu=torch.ones(max_bs, dtype=torch.int32, pin_memory=True),
    )
    bufs.last_page_len.fill_(1)  # ok: FC104
    return bufs


@dataclasses.dataclass
class GraphEntry:
    bs: int
    graph: torch.cuda.CUDAGraph
    positions: torch.Tensor
    logits: Optional[torch.Tensor] = None


def make_graph_fns(
    entry: GraphEntry,
    cfg: EngineConfig,
    bufs: GraphBuffers,
    decode_wrapper,
    window_wrapper,
    model: torch.nn.Module,
    kv_caches: list[torch.Tensor],
    stage: Callable[[ForwardBatch], None],
) -> tuple[Callable[[ForwardBatch], None], Callable[[], torch.Tensor]]:
    """``prepare(batch)`` fills the bucket's inputs and plans; ``launch()`` is the forward that gets captured."""
    bs = entry.bs
    attend = make_decode_attend(decode_wrapper)
    attend_window = make_window_attend(window_wrapper, cfg.kv_layout)
    dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
    prepared = 0

    def prepare(batch: ForwardBatch) -> None:
        nonlocal prepared
        n = batch.batch_size
        max_seq = int(batch.seq_lens.max())  # expect: FC101
        if max_seq > cfg.max_seq_len:
            raise ValueError(f"sequence of {max_seq} tokens exceeds max_seq_len={cfg.max_seq_len}")
        stage(batch)
        bufs.kv_indptr_cpu[: n + 1].copy_(batch.kv_indptr_cpu)
        nnz = int(batch.kv_indptr_cpu[n])  # ok: FC101
        bufs.kv_indptr_cpu[n + 1 : bs + 1].fill_(nnz)  # padded rows own no pages
        bufs.last_page_len_cpu[:n].copy_(batch.kv_last_page_len_cpu)
        bufs.last_page_len_cpu[n:bs].fill_(1)
        bufs.kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        decode_wrapper.plan(  # ok: FC102
            bufs.kv_indptr_cpu[: bs + 1],
            bufs.kv_indices[:nnz],
            bufs.last_page_len_cpu[:bs],
            *dims,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        window_wrapper.plan(  # expect: FC102
            bufs.kv_indptr[: bs + 1],
            bufs.kv_indices[:nnz],
            bufs.last_page_len_cpu[:bs],
            *dims,
            window_left=cfg.window_left,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        bufs.seq_lens[n:bs].fill_(1)  # ok: FC104
        bufs.last_page_len[n:bs].fill_(0)  # expect: FC104
        entry.positions = torch.cat([batch.positions, entry.positions[n:]])  # expect: FC107
        prepared += 1

    def launch() -> torch.Tensor:
        logits = model(bufs.input_ids[:bs], entry.positions, bufs.out_cache_loc[:bs], kv_caches, attend, attend_window)
        logger.debug(f"decode graph bs={bs}: kv pages {bufs.kv_indptr[bs]}")  # expect: FC101
        return logits

    return prepare, launch


def make_graph_step(entry: GraphEntry, prepare: Callable[[ForwardBatch], None]) -> Callable[[ForwardBatch], torch.Tensor]:
    def run(batch: ForwardBatch) -> torch.Tensor:
        prepare(batch)
        entry.graph.replay()
        return entry.logits[: batch.batch_size]

    return run


def make_warmup(launch: Callable[[], torch.Tensor], decode_wrapper, iters: int = 2) -> Callable[[], None]:
    def warm() -> None:
        if not getattr(decode_wrapper, "_use_cuda_graph", False):  # expect: FC103
            raise RuntimeError("bucket wrapper was built outside graph mode")
        for _ in range(iters):
            launch()
        torch.cuda.synchronize()  # ok: FC101

    return warm


def make_wrapper_probe(wrappers: dict) -> Callable[[], dict]:
    def probe() -> dict:
        return {bs: len(w._plan_info) for bs, w in wrappers.items()}  # expect: FC103

    return probe


def make_debug_dump(bufs: GraphBuffers) -> Callable[[int], dict]:
    def dump(bs: int) -> dict:
        return {
            "kv_indptr": bufs.kv_indptr[: bs + 1].tolist(),  # ok: FC101
            "last_page_len": bufs.last_page_len_cpu[:bs].tolist(),
        }

    return dump


class GraphRunner:
    def __init__(self, cfg: EngineConfig, model: torch.nn.Module, kv_caches: list[torch.Tensor], device: torch.device):
        self.cfg = cfg
        self.model = model
        self.kv_caches = kv_caches
        self.device = device
        self._kv_layout = cfg.kv_layout
        self.bufs = init_graph_buffers(cfg, device)
        self.decode_backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"
        self.workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.graph_wrapper = make_graph_wrapper_cache(self.workspace, self.bufs, cfg.kv_layout, self.decode_backend)
        self.window_wrapper = window_decode_wrapper(device.index or 0, cfg.kv_layout)
        self.entries: dict[int, GraphEntry] = {}
        self.steps: dict[int, Callable[[ForwardBatch], torch.Tensor]] = {}
        self.wrappers: dict = {}
        self.mempool = None
        self.stage = self._make_stager()
        self.probe = make_wrapper_probe(self.wrappers)
        self.dump = make_debug_dump(self.bufs)

    def _make_stager(self) -> Callable[[ForwardBatch], None]:
        def stage(batch: ForwardBatch) -> None:
            n = batch.batch_size
            if n > self.bufs.input_ids.shape[0]:
                self.bufs.input_ids = torch.empty(n, dtype=torch.int64, device=self.device)  # expect: FC107
            self.bufs.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
            self.bufs.out_cache_loc[:n].copy_(batch.out_cache_loc, non_blocking=True)
            self.bufs.seq_lens[:n].copy_(batch.seq_lens, non_blocking=True)

        return stage

    @torch.inference_mode()
    def capture_all(self) -> None:
        for bs in reversed(self.cfg.graph_buckets()):
            decode_wrapper = self.graph_wrapper(bs)
            entry = GraphEntry(bs=bs, graph=torch.cuda.CUDAGraph(), positions=self.bufs.positions[:bs])
            prepare, launch = make_graph_fns(
                entry, self.cfg, self.bufs, decode_wrapper, self.window_wrapper, self.model, self.kv_caches, self.stage
            )
            prepare(dummy_batch(self.cfg, bs, self.device))
            make_warmup(launch, decode_wrapper)()
            with torch.cuda.graph(entry.graph, pool=self.mempool):
                entry.logits = launch()
            self.mempool = entry.graph.pool()
            self.entries[bs] = entry
            self.wrappers[bs] = decode_wrapper
            self.steps[bs] = make_graph_step(entry, prepare)

    @cuda_timed("replay")
    def replay(self, bs: int, batch: ForwardBatch) -> torch.Tensor:
        assert self.steps, "capture_all() must run before replay()"  # ok: FC109
        return self.steps[bs](batch)
