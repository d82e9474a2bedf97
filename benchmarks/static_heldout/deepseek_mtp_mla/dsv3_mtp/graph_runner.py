"""CUDA graphs for the verify pass, the MTP draft step and the MTP draft-extend pass, one set per bucket."""
from __future__ import annotations

import bisect
import dataclasses
import logging
from typing import TYPE_CHECKING, Dict, Optional, Tuple

import torch

from dsv3_mtp.spec import MTPDraftInput, SpecBatch

if TYPE_CHECKING:
    from dsv3_mtp.worker import MTPWorker

logger = logging.getLogger(__name__)

_PLAN_INFO_ATTR = "_plan_info"


@dataclasses.dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    hidden_states: torch.Tensor
    output: Tuple[torch.Tensor, torch.Tensor]


class MTPGraphRunner:
    def __init__(self, worker: "MTPWorker"):
        self.attn_backend = worker.attn_backend
        self.target = worker.target_model
        self.draft = worker.draft_model
        self.capture_bs = sorted(worker.limits.cuda_graph_bs)
        self.k = worker.limits.tokens_per_req
        max_tokens = self.capture_bs[-1] * self.k
        with torch.device(worker.device):
            self.input_ids = torch.zeros(max_tokens, dtype=torch.int64)
            self.positions = torch.zeros(max_tokens, dtype=torch.int64)
            self.out_cache_loc = torch.zeros(max_tokens, dtype=torch.int64)
            self.req_pool_indices = torch.zeros(self.capture_bs[-1], dtype=torch.int32)
            self.seq_lens = torch.ones(self.capture_bs[-1], dtype=torch.int32)
            self.hidden_states = torch.zeros(max_tokens, worker.cfg.hidden_size, dtype=torch.bfloat16)
        self.seq_lens_cpu = torch.ones(self.capture_bs[-1], dtype=torch.int32)
        self.stream = torch.cuda.Stream()
        self.pool: Optional[Tuple[int, int]] = None
        self.graphs: Dict[str, Dict[int, GraphEntry]] = {"verify": {}, "draft": {}, "draft_extend": {}}
        self._plan_info: Dict[Tuple[str, int], int] = {}
        for bs in reversed(self.capture_bs):
            self.record_verify(bs)
            self.record_draft(bs)
            self.record_draft_extend(bs)
        self.check_wrappers()

    # ------------------------------------------------------------------ capture
    def _record(self, mode: str, bs: int, n: int) -> None:
        use_target = mode == "verify"

        def run() -> Tuple[torch.Tensor, torch.Tensor]:
            if use_target:
                return self.target(self.input_ids[:n], self.positions[:n], self.attn_backend)
            return self.draft(self.input_ids[:n], self.positions[:n], self.hidden_states[:n], self.attn_backend)

        run()
        self.stream.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = run()
        self.pool = graph.pool()
        self.graphs[mode][bs] = GraphEntry(graph, self.hidden_states[:n], out)

    def record_verify(self, bs: int) -> None:
        n = bs * self.k
        self.attn_backend.bind_graph_wrapper("verify", bs)
        self.attn_backend.prepare_verify_inputs(bs, bs, self.req_pool_indices[:bs], self.seq_lens_cpu[:bs], self.out_cache_loc[:n])
        max_seq_len = int(self.seq_lens_cpu[:bs].max()) + self.k  # ok: FC101
        self._plan_info[("verify", bs)] = max_seq_len  # ok: FC103
        self._record("verify", bs, n)

    def record_draft(self, bs: int) -> None:
        self.attn_backend.bind_graph_wrapper("draft", bs)
        self.attn_backend.prepare_draft_inputs(
            bs, bs, self.req_pool_indices[:bs], self.seq_lens_cpu[:bs], self.positions[:bs], self.out_cache_loc[:bs]
        )
        # the trtllm-gen MLA kernel takes max_seq_len as a launch argument
        self.attn_backend.forward_metadata.max_seq_len = self.seq_lens[:bs].max().item()  # expect: FC101
        self._plan_info[("draft", bs)] = self.attn_backend.forward_metadata.max_seq_len
        self._record("draft", bs, bs)

    def record_draft_extend(self, bs: int) -> None:
        n = bs * self.k
        accept_all = torch.full((bs,), self.k, dtype=torch.int32)
        self.attn_backend.plan_draft_extend(bs, accept_all, self.seq_lens_cpu[:bs], self.req_pool_indices[:bs], self.out_cache_loc[:n])
        self._record("draft_extend", bs, n)

    def check_wrappers(self) -> None:
        for (mode, bs), w in self.attn_backend.graph_wrappers.items():
            if getattr(w, _PLAN_INFO_ATTR, None) is None:  # expect: FC103
                raise RuntimeError(f"{mode} graph for bs={bs} was recorded without a plan")
            logger.debug("%s graph bs=%d recorded for max_seq_len=%d", mode, bs, self._plan_info[(mode, bs)])

    # ------------------------------------------------------------------ replay
    def can_run(self, raw_bs: int) -> bool:
        return raw_bs <= self.capture_bs[-1]

    def _bucket(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def replay_verify(self, batch: SpecBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        raw_bs = batch.batch_size
        bs = self._bucket(raw_bs)
        n_raw, n = raw_bs * self.k, bs * self.k
        self.input_ids[:n_raw].copy_(batch.draft_tokens.flatten())
        self.positions[:n_raw].copy_(batch.positions)
        self.out_cache_loc[:n_raw].copy_(batch.out_cache_loc)
        self.req_pool_indices[:raw_bs].copy_(batch.req_pool_indices)
        self.seq_lens_cpu[:raw_bs].copy_(batch.seq_lens_cpu)
        self.attn_backend.prepare_verify_inputs(bs, raw_bs, self.req_pool_indices[:bs], self.seq_lens_cpu[:bs], self.out_cache_loc[:n])
        # padded rows attend to nothing
        self.attn_backend.kv_lens[raw_bs:bs].zero_()  # expect: FC104
        entry = self.graphs["verify"][bs]
        entry.graph.replay()
        logits, hidden = entry.output
        return logits[:n_raw], hidden[:n_raw]

    def replay_draft(
        self, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens_cpu: torch.Tensor, tokens: torch.Tensor,
        hidden: torch.Tensor, positions: torch.Tensor, out_cache_loc: torch.Tensor,
    ) -> Tuple[MTPDraftInput, torch.Tensor, torch.Tensor]:
        bs = self._bucket(raw_bs)
        self.input_ids[:raw_bs].copy_(tokens)
        self.positions[:raw_bs].copy_(positions)
        self.out_cache_loc[:raw_bs].copy_(out_cache_loc)
        self.req_pool_indices[:raw_bs].copy_(req_pool_indices)
        self.seq_lens_cpu[:raw_bs].copy_(seq_lens_cpu)
        draft_in = self.attn_backend.prepare_draft_inputs(
            bs, raw_bs, self.req_pool_indices[:bs], self.seq_lens_cpu[:bs], self.positions[:bs], self.out_cache_loc[:bs]
        )
        entry = self.graphs["draft"][bs]
        entry.hidden_states = hidden.clone()  # expect: FC107
        entry.graph.replay()
        logits, new_hidden = entry.output
        return draft_in, logits[:raw_bs], new_hidden[:raw_bs]

    def replay_draft_again(self, raw_bs: int, tokens: torch.Tensor, hidden: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        entry = self.graphs["draft"][self._bucket(raw_bs)]
        self.input_ids[:raw_bs].copy_(tokens)
        entry.hidden_states[:raw_bs].copy_(hidden)
        entry.graph.replay()
        logits, new_hidden = entry.output
        return logits[:raw_bs], new_hidden[:raw_bs]

    def replay_draft_extend(
        self, raw_bs: int, ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        n = ids.shape[0]
        entry = self.graphs["draft_extend"][self._bucket(raw_bs)]
        self.input_ids[:n].copy_(ids)
        self.positions[:n].copy_(positions)
        entry.hidden_states[:n].copy_(hidden)
        entry.graph.replay()
        logits, new_hidden = entry.output
        return logits[:n], new_hidden[:n]
