from dataclasses import dataclass, field

import numpy as np
import torch

from vidserve.attn.backend import DecodeBatch, VideoAttnBackend
from vidserve.config import VideoEngineConfig
from vidserve.mrope import build_positions
from vidserve.runner.graphs import DecodeGraphs
from vidserve.vision.chunk_planner import VideoChunk, VisionChunkPlanner


@dataclass
class VideoRequest:
    rid: int
    input_ids: np.ndarray
    video_grid_thw: np.ndarray
    second_per_grid: np.ndarray
    num_frames: int
    pages: list = field(default_factory=list)
    rope_delta: int = 0
    seq_len: int = 0
    slot: int = -1


class VideoEngine:
    def __init__(self, cfg: VideoEngineConfig, backend: VideoAttnBackend, graphs: DecodeGraphs,
                 planner: VisionChunkPlanner, video_token_id: int, eos_id: int, max_chunks: int = 64):
        self.cfg = cfg
        self.backend = backend
        self.graphs = graphs
        self.planner = planner
        self.video_token_id, self.eos_id, self.max_chunks = video_token_id, eos_id, max_chunks
        self.running: list[VideoRequest] = []
        self.waiting: list[VideoRequest] = []
        self.pending_chunks: list[VideoChunk] = []
        self._free_slots = list(range(cfg.max_batch))

    def add_request(self, req: VideoRequest):
        assert req.num_frames <= self.cfg.frames_per_chunk * self.max_chunks  # expect: FC109
        pos, req.rope_delta = build_positions(req.input_ids, self.video_token_id, req.video_grid_thw, req.second_per_grid)
        req.seq_len = pos.shape[1]
        req.slot = self._alloc_slot()
        self.waiting.append(req)
        per = self.cfg.frames_per_chunk
        for i in range(-(-req.num_frames // per)):
            t, h, w = (int(x) for x in req.video_grid_thw[0])
            grid = np.array([min(t, per // self.cfg.temporal_patch_size), h, w])
            valid = torch.arange(per, device=self.backend.device) < req.num_frames - i * per
            self.pending_chunks.append(VideoChunk(i, grid, valid, torch.empty(0, device=self.backend.device)))

    def _prefill(self, req: VideoRequest):
        n = len(req.input_ids)
        qo_indptr = torch.tensor([0, n], dtype=torch.int32, device=self.backend.device)
        kv_indptr = torch.tensor([0, len(req.pages)], dtype=torch.int32)
        last = torch.tensor([(n - 1) % self.cfg.page_size + 1], dtype=torch.int32)
        pages = torch.tensor(req.pages, dtype=torch.int32, device=self.backend.device)
        self.backend.prepare_prefill(qo_indptr, kv_indptr, pages, last, torch.zeros(2, dtype=torch.int32))
        self.running.append(req)

    def _alloc_slot(self):
        assert self._free_slots, "no free decode slot"  # ok: FC109
        return self._free_slots.pop()

    def _decode_batch(self) -> DecodeBatch:
        reqs = self.running
        bs = len(reqs)
        self.seq_lens_host = torch.zeros(bs, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.seq_lens_host.numpy()[:] = [r.seq_len for r in reqs]
        page_counts = np.array([len(r.pages) for r in reqs] + [0] * (self.cfg.max_batch - bs), dtype=np.int32)
        indptr = np.concatenate([[0], np.cumsum(page_counts)]).astype(np.int32)
        last = np.ones(self.cfg.max_batch, dtype=np.int32)
        last[:bs] = (self.seq_lens_host.numpy() - 1) % self.cfg.page_size + 1
        pages = np.concatenate([np.asarray(r.pages, dtype=np.int32) for r in reqs])
        return DecodeBatch(
            seq_lens=self.seq_lens_host.to(self.backend.device, non_blocking=True),
            seq_lens_cpu=self.seq_lens_host,
            kv_indptr_cpu=torch.from_numpy(indptr).pin_memory(),
            kv_indices=torch.from_numpy(pages).to(self.backend.device, non_blocking=True),
            last_page_len_cpu=torch.from_numpy(last).pin_memory(),
            mem_indptr_cpu=torch.zeros(self.cfg.max_batch + 1, dtype=torch.int32, pin_memory=True),
            rope_deltas_cpu=torch.tensor([r.rope_delta for r in reqs], dtype=torch.int64),
            input_ids=torch.tensor([int(r.input_ids[-1]) for r in reqs], device=self.backend.device),
        )

    def _free_request(self, req: VideoRequest, batch: DecodeBatch, row: int):
        start, end = int(batch.kv_indptr_cpu[row]), int(batch.kv_indptr_cpu[row + 1])
        self.backend.kv_indices[start:end].fill_(0)  # expect: FC104
        self._free_slots.append(req.slot)

    def step(self):
        for chunk in self.pending_chunks:
            self.planner.prepare_chunk(chunk)
        self.pending_chunks.clear()
        while self.waiting:
            self._prefill(self.waiting.pop(0))
        if not self.running:
            return []
        batch = self._decode_batch()
        logits = self.graphs.launch(batch)
        sampled = torch.argmax(logits, dim=-1)
        sampled = torch.where(logits.isfinite().all(dim=-1), sampled, self.eos_id)  # ok: FC101
        next_ids = sampled.tolist()  # expect: FC101
        for row, (req, tok) in enumerate(zip(self.running, next_ids)):
            req.input_ids, req.seq_len = np.append(req.input_ids, tok), req.seq_len + 1
            if tok == self.eos_id:
                self._free_request(req, batch, row)
        self.running = [r for r, tok in zip(self.running, next_ids) if tok != self.eos_id]
        return next_ids
