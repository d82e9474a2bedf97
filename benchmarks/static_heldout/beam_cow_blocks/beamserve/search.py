"""The beam search step (extend every beam by one token, keep the best ``beam_width`` per request) and the
CUDA graphs of the beam decode, one per beam-count bucket."""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Tuple

import torch

from beamserve.attention import BeamBatch, BeamDecodeBackend
from beamserve.blocks import BeamLayout, CoWBlockManager
from beamserve.config import BeamConfig
from beamserve.kernels.copy_ops import BlockCopyPlanner
from beamserve.model import BeamDecoder


# FlashInfer keeps the result of the last plan() here; None until the wrapper was planned once
_PLAN_INFO_ATTR = "_plan_info"


class BeamGraphRunner:
    _STATIC_INPUTS = ("beam_tokens", "beam_positions")

    def __init__(self, model: BeamDecoder, backend: BeamDecodeBackend, cfg: BeamConfig):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.buckets: List[int] = sorted(cfg.graph_beam_buckets)
        self.max_bucket = self.buckets[-1]
        self._fixed_batch_size: Optional[int] = self.buckets[0] if len(self.buckets) == 1 else None  # ok: FC103
        device = backend.device
        self.beam_tokens = torch.zeros(self.max_bucket, dtype=torch.int64, device=device)
        self.beam_positions = torch.zeros(self.max_bucket, dtype=torch.int64, device=device)
        self.static_scores = torch.zeros(self.max_bucket, cfg.vocab_size, dtype=torch.float32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def pick_bucket(self, n: int) -> int:
        if self._fixed_batch_size is not None:
            return self._fixed_batch_size
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def warmup_and_record(self, bs: int) -> None:
        self.backend.warm_graph_plan(bs)
        tokens, positions, scores = self.beam_tokens[:bs], self.beam_positions[:bs], self.static_scores[:bs]
        self.model.decode(tokens, positions, bs, scores)
        torch.cuda.synchronize()  # ok: FC101
        if not torch.isfinite(scores).all():  # expect: FC101
            raise RuntimeError(f"warm-up of beam bucket {bs} produced non-finite logits")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.model.decode(tokens, positions, bs, scores)
        self.pool = graph.pool()
        self.graphs[bs] = graph

    def record_all(self) -> None:
        for bs in reversed(self.buckets):
            self.warmup_and_record(bs)

    def replay(self, batch: BeamBatch) -> torch.Tensor:
        padded = self.pick_bucket(batch.num_beams)
        wrapper = self.backend.graph_wrappers[padded]
        if getattr(wrapper, _PLAN_INFO_ATTR, None) is None or batch.layout_changed:  # expect: FC103
            self.backend.plan_beam_decode(batch, padded)
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(batch, name).clone())  # expect: FC107
        self.graphs[padded].replay()
        return self.static_scores[: batch.num_beams]


@dataclass
class BeamRequest:
    rid: int
    beam_ids: List[int]
    max_new_tokens: int
    generated: int = 0


class BeamSearchEngine:
    def __init__(self, cfg: BeamConfig, beam_width: int, device: str = "cuda"):
        assert 1 <= beam_width <= cfg.max_beam_width, f"beam width {beam_width} is not supported"  # expect: FC109
        self.cfg = cfg
        self.beam_width = beam_width
        self.device = torch.device(device)
        self.manager = CoWBlockManager(cfg.num_blocks, cfg.block_size, cfg.max_blocks_per_beam)
        self.backend = BeamDecodeBackend(cfg, self.device)
        self.kv_caches = [
            torch.zeros(
                cfg.num_blocks, 2, cfg.block_size, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.dtype, device=self.device
            )
            for _ in range(cfg.num_layers)
        ]
        self.model = BeamDecoder(cfg, self.backend, self.kv_caches).to(self.device)
        self.copy_planner = BlockCopyPlanner(cfg, self.backend, self.kv_caches)
        self.graph_runner = BeamGraphRunner(self.model, self.backend, cfg)

        max_beams = cfg.max_beams_per_step
        self.beam_tokens_gpu = torch.zeros(max_beams, dtype=torch.int64, device=self.device)
        self.beam_positions_gpu = torch.zeros(max_beams, dtype=torch.int64, device=self.device)
        self.beam_scores = torch.zeros(max_beams, dtype=torch.float32, device=self.device)
        self.req_base_gpu = torch.arange(0, max_beams, beam_width, dtype=torch.int64, device=self.device)
        self.tokens_cpu = [torch.zeros(max_beams, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self.copy_events = [torch.cuda.Event(), torch.cuda.Event()]
        self.requests: List[BeamRequest] = []
        self.outputs: Deque[Tuple[List[int], torch.Tensor, torch.cuda.Event]] = collections.deque()
        self._next_beam = 0
        self._steps = 0

    def _new_beam(self) -> int:
        self._next_beam += 1
        return self._next_beam

    def add_request(self, rid: int, prompt_blocks: List[int], prompt_len: int, last_token: int, max_new_tokens: int) -> None:
        """Start from the prompt KV the prefill worker wrote; all beams share it."""
        head = self._new_beam()
        self.manager.adopt(head, prompt_blocks, prompt_len)
        beams = [head]
        for _ in range(self.beam_width - 1):
            child = self._new_beam()
            self.manager.fork(head, child)
            beams.append(child)
        row = len(self.requests) * self.beam_width
        w = self.beam_width
        self.beam_tokens_gpu[row : row + w].fill_(last_token)
        self.beam_positions_gpu[row : row + w].fill_(prompt_len)
        self.beam_scores[row : row + w] = torch.tensor([0.0] + [-1e9] * (w - 1))
        self.requests.append(BeamRequest(rid, beams, max_new_tokens))

    def _reorder(self, layout: BeamLayout, parent_rows: List[int]) -> None:
        old = layout.beam_ids
        new_beams: List[int] = []
        for row in parent_rows:
            child = self._new_beam()
            self.manager.fork(old[row], child)
            new_beams.append(child)
        for beam in old:
            self.manager.free(beam)
        w = self.beam_width
        for i, req in enumerate(self.requests):
            req.beam_ids = new_beams[i * w : (i + 1) * w]
            req.generated += 1

    def step(self) -> int:
        if not self.requests:
            return 0
        beams_by_req = [r.beam_ids for r in self.requests]
        self.manager.append_slots([b for ids in beams_by_req for b in ids])
        layout = self.manager.layout(beams_by_req)
        n = layout.num_beams
        self.copy_planner.plan_copies(self.manager.drain_copies())
        padded = self.graph_runner.pick_bucket(n) if n <= self.graph_runner.max_bucket else None
        self.copy_planner.apply_copies(padded)
        self.backend.beam_num_blocks[:n].copy_(torch.from_numpy(layout.suffix_counts_np), non_blocking=True)  # ok: FC104

        batch = BeamBatch(layout=layout, beam_tokens=self.beam_tokens_gpu[:n], beam_positions=self.beam_positions_gpu[:n])
        if padded is not None:
            logits = self.graph_runner.replay(batch)
        else:
            self.backend.plan_eager_beams(batch)
            logits = self.model.decode_eager(batch.beam_tokens, batch.beam_positions)

        scores = torch.log_softmax(logits, dim=-1) + self.beam_scores[:n, None]
        top_scores, top_idx = scores.view(layout.num_requests, -1).topk(self.beam_width, dim=-1)
        parents = (top_idx // self.cfg.vocab_size + self.req_base_gpu[: layout.num_requests, None]).flatten()
        tokens = (top_idx % self.cfg.vocab_size).flatten()
        parent_rows = parents.tolist()  # expect: FC101
        self.beam_scores[:n].copy_(top_scores.flatten())
        self.beam_tokens_gpu[:n].copy_(tokens)
        self.beam_positions_gpu[:n] += 1
        if padded is not None:
            # the next replay may skip plan(): keep the graph's last-page lengths in the new beam order
            last = self.backend.graph_bufs[padded]["last"]
            last[:n].copy_(last[:n].index_select(0, parents))  # expect: FC104

        slot = self._steps % 2
        host = self.tokens_cpu[slot][:n]
        host.copy_(tokens, non_blocking=True)  # ok: FC101
        self.copy_events[slot].record()
        self._reorder(layout, parent_rows)
        self.outputs.append(([r.rid for r in self.requests], host, self.copy_events[slot]))
        self._steps += 1
        return n

    def drain_outputs(self) -> List[Tuple[List[int], List[int]]]:
        """Called by the detokenizer loop, never on the step path."""
        done = []
        while self.outputs:
            rids, host, event = self.outputs.popleft()
            event.synchronize()
            done.append((rids, host.tolist()))
        return done
