"""One engine step: launch the prefill batch on the prefill stream, admit the requests it
finished to decode, replay the decode graph on the decode stream, copy tokens out async."""

from typing import List, Optional

import torch

from overlap import (
    Admission,
    DecodeBatch,
    OverlapConfig,
    PrefillBatch,
    StepPlan,
    StreamAwarePool,
    make_decode_batch,
    make_prefill_batch,
    make_streams,
)
from overlap_attn.buffers import LaneBuffers
from overlap_attn.lanes import DecodeLane, PrefillLane, workspace_ptrs
from overlap_attn.workspaces import StreamWorkspaces
from overlap_graphs.decode_graphs import DecodeGraphPool
from overlap_graphs.model import OverlapModel


class OverlapEngine:
    def __init__(self, cfg: OverlapConfig, kv_cache: torch.Tensor, device: str = "cuda"):
        dev = torch.device(device)
        self.cfg = cfg
        self.kv_cache = kv_cache
        self.streams = make_streams(dev)
        self.bufs = LaneBuffers(cfg, dev)
        self.ws = StreamWorkspaces(cfg, dev)
        self.pool = StreamAwarePool(cfg.pool_block_bytes, cfg.pool_blocks, dev, cfg.pool_grow_blocks)
        self.prefill = PrefillLane(cfg, self.bufs, self.ws, self.streams, self.pool, kv_cache)
        self.decode = DecodeLane(cfg, self.bufs, self.ws, self.streams)
        self.model = OverlapModel(cfg, self.prefill, self.decode).to(dev)
        self.prefill.attach(self.model)
        self.graphs = DecodeGraphPool(cfg, self.model, self.decode, self.streams, kv_cache)
        self.max_graph_bs = max(cfg.buckets)
        self.tokens_pinned = torch.empty(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.first_tokens: List[int] = []
        self.last_decode_rows = 0

    def build_prefill(self, request_ids, token_lists, prefix_lens, page_tables) -> PrefillBatch:
        return make_prefill_batch(request_ids, token_lists, prefix_lens, page_tables, self.cfg.page_size, self.bufs.device)

    def build_decode(self, tokens, seq_lens, page_tables) -> DecodeBatch:
        return make_decode_batch(tokens, seq_lens, page_tables, self.cfg.page_size, self.bufs.device)

    def warmup(self) -> None:
        self.check_lane_isolation()
        self.graphs.capture_decode_graphs()

    def check_lane_isolation(self) -> None:
        ptrs = workspace_ptrs([self.prefill.wrapper, self.decode.eager, self.decode.handoff])
        if len(set(ptrs)) != len(ptrs):
            raise RuntimeError("two lanes share an int workspace")

    def _admit(self, adm: Admission) -> None:
        # the handed-over request's pages were written on the prefill stream
        self.streams.prefill_done.synchronize()  # expect: FC101
        pages = torch.from_numpy(adm.pages_np).to(self.bufs.device, non_blocking=True)
        off = adm.row_offset
        self.bufs.kv_indices["decode"][off : off + pages.numel()].copy_(pages, non_blocking=True)  # expect: FC104

    def _decode(self, batch: DecodeBatch) -> torch.Tensor:
        if batch.batch_size <= self.max_graph_bs:
            return self.graphs.replay_bucket(batch)
        self.decode.plan_eager(batch)
        with torch.cuda.stream(self.streams.decode):
            return self.model.decode_eager(batch.tokens, batch.positions, self.kv_cache)

    def step(self, plan: StepPlan) -> Optional[torch.Tensor]:
        first = None
        if plan.prefill is not None:
            first = self.prefill.launch(plan.prefill)
        for adm in plan.admitted:
            self._admit(adm)
        logits = None
        if plan.decode is not None:
            # decode reads pages prefill may have just written: order the streams, not the host
            self.streams.decode.wait_event(self.streams.prefill_done)  # ok: FC101
            logits = self._decode(plan.decode)
            with torch.cuda.stream(self.streams.decode):
                tokens = logits.argmax(-1)
                n = tokens.shape[0]
                if n > self.tokens_pinned.numel():
                    self.tokens_pinned = torch.empty(n, dtype=torch.int64, pin_memory=True)  # ok: FC107
                self.tokens_pinned[:n].copy_(tokens, non_blocking=True)  # ok: FC101
                self.streams.copy_done.record(self.streams.decode)
            self.last_decode_rows = n
        if first is not None:
            self.first_tokens.extend(first.tolist())  # expect: FC101
        return logits

    def drain_outputs(self) -> List[int]:
        """Called by the output thread, off the step path."""
        self.streams.copy_done.synchronize()
        return self.tokens_pinned[: self.last_decode_rows].tolist()

    def pool_report(self) -> dict:
        return {"levels": self.pool._num_levels, "blocks": self.pool.num_blocks}  # ok: FC103
