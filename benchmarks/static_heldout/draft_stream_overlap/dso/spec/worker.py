"""The overlapped speculative worker: target verifies on the main stream while the draft drafts on a side stream."""
import queue
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from dso.attn import ModelAttnState, StepAttnInputs
from dso.config import ModelShape, SpecConfig, StreamPair
from dso.graphs import ModelGraphs
from dso.models import DraftModel, TargetModel
from dso.spec.accept import greedy_accept


@dataclass
class SpecBatch:
    batch_size: int
    verify_ids: torch.Tensor
    verify_pos: torch.Tensor
    verify_inputs: StepAttnInputs
    last_ids: torch.Tensor
    last_pos: torch.Tensor
    last_hidden: torch.Tensor
    draft_inputs: List[StepAttnInputs] = field(default_factory=list)
    draft_tokens: Optional[torch.Tensor] = None


class OverlapSpecWorker:
    def __init__(
        self,
        draft: DraftModel,
        target: TargetModel,
        draft_graphs: ModelGraphs,
        scfg: SpecConfig,
        streams: StreamPair,
    ):
        assert scfg.num_spec_tokens <= scfg.max_draft_tokens  # expect: FC109
        self.draft = draft
        self.target = target
        self.draft_graphs = draft_graphs
        self.scfg = scfg
        self.streams = streams
        device = draft.attn.device
        k = scfg.num_spec_tokens
        self.draft_tokens_buf = torch.zeros(scfg.max_batch_size, k, dtype=torch.int64, device=device)
        self.accept_lens = torch.zeros(scfg.max_batch_size, dtype=torch.int64, device=device)
        self.accept_host = torch.zeros(scfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.out_events: "queue.Queue[torch.cuda.Event]" = queue.Queue()
        self.total_accepted = 0
        self._inflight = 0

    def _check_inflight(self) -> None:
        assert self._inflight <= 1  # ok: FC109

    def _join_draft(self) -> None:
        # the side stream must finish the previous round before its tokens are verified
        self.streams.draft_done.synchronize()  # expect: FC101

    def _launch_draft(self, batch: SpecBatch) -> None:
        bs = batch.batch_size
        bucket = self.draft_graphs.bucket_for(bs)
        with torch.cuda.stream(self.streams.draft):
            self.streams.draft.wait_event(self.streams.target_done)
            ids, pos, hidden = batch.last_ids, batch.last_pos, batch.last_hidden
            for k in range(self.scfg.num_spec_tokens):
                if bucket is not None:
                    logits = self.draft_graphs.replay(bucket, bs, ids, pos, hidden, batch.draft_inputs[k])
                else:
                    self.draft.attn.plan_decode(batch.draft_inputs[k])
                    logits = self.draft.decode_step(ids, pos, hidden)
                ids = logits.argmax(dim=-1)
                pos = pos + 1
                self.draft_tokens_buf[:bs, k].copy_(ids)
            self.streams.draft_done.record()
        batch.draft_tokens = self.draft_tokens_buf[:bs]
        self._inflight += 1

    def _commit(self, bs: int) -> None:
        if self.accept_host.numel() < bs:
            self.accept_host = torch.empty(bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.accept_host[:bs].copy_(self.accept_lens[:bs], non_blocking=True)
        lens = self.accept_host[:bs].tolist()  # expect: FC101
        self.total_accepted += sum(lens)
        ev = torch.cuda.Event()
        ev.record()
        self.out_events.put(ev)

    def step(self, batch: SpecBatch) -> None:
        self._check_inflight()
        self._join_draft()
        self._inflight = 0
        bs = batch.batch_size
        k = self.scfg.num_spec_tokens
        # 1. verify last round's drafts with the target (main stream)
        self.target.attn.plan_verify(batch.verify_inputs)
        logits, hidden = self.target.verify(batch.verify_ids, batch.verify_pos)
        target_tokens = logits.argmax(dim=-1).view(bs, k + 1)
        self.streams.target_done.record()
        # 2. draft the next round on the side stream, overlapping acceptance below
        self._launch_draft(batch)
        accept_lens, accepted, bonus, padded = greedy_accept(batch.draft_tokens, target_tokens)
        self.accept_lens[:bs].copy_(accept_lens)
        torch.cuda.current_stream().wait_event(self.streams.draft_done)  # ok: FC101
        # 3. the draft assumed every token would be accepted: give back the rejected slots
        rejected = (k - accept_lens).to(torch.int32)
        self.draft.attn.g_last_page_len[:bs].sub_(rejected)  # expect: FC104
        self.target.attn.kv_indptr_host[: bs + 1].copy_(batch.verify_inputs.kv_indptr_cpu[: bs + 1])  # ok: FC104
        self._commit(bs)

    # ---- off the step ------------------------------------------------------------------------

    def drain_outputs(self, sink) -> None:
        while True:
            ev = self.out_events.get()
            ev.synchronize()  # ok: FC101
            sink(self.total_accepted)


def build_worker(draft_shape: ModelShape, target_shape: ModelShape, scfg: SpecConfig, device: torch.device) -> OverlapSpecWorker:
    streams = StreamPair(device)
    draft_backend = "trtllm-gen" if scfg.sm_version >= 100 else "fa2"
    draft_attn = ModelAttnState(draft_shape, scfg, device, decode_backend=draft_backend)
    target_attn = ModelAttnState(target_shape, scfg, device)
    draft_attn.borrow_workspace(target_attn)
    draft = DraftModel(draft_shape, draft_attn, scfg, device).to(device)
    target = TargetModel(target_shape, target_attn, scfg, device).to(device)
    draft_graphs = ModelGraphs(draft, draft_attn, scfg, capture_stream=streams.draft, record_extend=True)
    target_graphs = ModelGraphs(target, target_attn, scfg)
    draft_graphs.record_all()
    target_graphs.record_all()
    return OverlapSpecWorker(draft, target, draft_graphs, scfg, streams)
