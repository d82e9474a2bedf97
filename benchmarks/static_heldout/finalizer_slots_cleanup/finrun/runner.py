import logging
import math
from typing import Dict, List, Optional

import torch

from fincore.limits import ServeLimits
from fincore.state import DecodeBatch, RequestState, build_batch
from finattn.backend import FlashInferAttn
from finattn.buffers import reset_after
from finrun.model import Model
from finrun.pages import PagePool

logger = logging.getLogger(__name__)


class GraphEntry:
    __slots__ = ("graph", "static_ids", "static_pos", "out")

    def __init__(self, graph: torch.cuda.CUDAGraph, static_ids: torch.Tensor, static_pos: torch.Tensor, out: torch.Tensor):
        self.graph = graph
        self.static_ids = static_ids
        self.static_pos = static_pos
        self.out = out


class ModelRunner:
    def __init__(self, limits: ServeLimits, device: torch.device):
        self.limits = limits
        self.device = device
        self.attn = FlashInferAttn(limits, device)
        self._backend = self.attn
        self.model = Model(limits, self.attn)
        self.pool = PagePool(limits.max_pages, self.attn)
        self.graphs: Dict[int, GraphEntry] = {}
        max_bs = max(limits.buckets)
        self.static_bufs: Dict[str, torch.Tensor] = {
            "ids": torch.zeros(max_bs, dtype=torch.int64, device=device),
            "pos": torch.zeros(max_bs, dtype=torch.int64, device=device),
            "logits": torch.zeros(max_bs, 32000, dtype=torch.float32, device=device),
        }
        self.top_k_buf = torch.zeros(limits.max_seqs, dtype=torch.int32, device=device)
        self.ids_cpu = torch.zeros(limits.max_seqs, dtype=torch.int64)
        self.lp_pinned = torch.zeros(limits.max_seqs, dtype=torch.float32, pin_memory=True)
        self.probs_buf: Optional[torch.Tensor] = None

    def capture_graphs(self) -> None:
        assert not self.graphs, "graphs already captured"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101
        with reset_after(self.attn.g_indptr):  # expect: FC104
            for bs in sorted(self.limits.buckets, reverse=True):
                self.capture_one_batch_size(bs)
        logger.info("captured %d buckets with %s", len(self.graphs), type(self._backend).__name__)

    def capture_one_batch_size(self, bs: int) -> None:
        ids = self.static_bufs["ids"][:bs]
        pos = self.static_bufs["pos"][:bs]
        self.attn.init_forward_metadata_capture_cuda_graph(bs)
        warm = self.model(ids, pos)
        peak = warm.float().abs().max().item()  # expect: FC101
        torch.cuda.current_stream().synchronize()  # ok: FC101
        if not math.isfinite(peak):  # ok: FC101
            raise RuntimeError(f"bucket {bs}: warm-up logits are not finite")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = self.model(ids, pos)
        self.graphs[bs] = GraphEntry(g, ids, pos, out)
        self.capture_out = out.clone()  # ok: FC107

    def _pick_bucket(self, n: int) -> int:
        largest = max(self.limits.buckets)  # ok: FC101
        assert n <= largest, "no graph for this batch size"  # expect: FC109
        return min(b for b in self.limits.buckets if b >= n)

    def replay(self, batch: DecodeBatch) -> List[int]:
        n = batch.num_seqs
        bs = self._pick_bucket(n)
        entry = self.graphs[bs]
        entry.static_ids[:n].copy_(batch.input_ids)  # ok: FC104
        entry.static_pos = batch.positions.clone()  # expect: FC107
        self.attn.cu_q = torch.cat([batch.qo_indptr, batch.qo_indptr[-1:]])  # expect: FC107
        self.attn.init_forward_metadata_replay_cuda_graph(bs, batch)
        entry.graph.replay()
        self.attn.g_last[:n].add_(1)  # expect: FC104
        torch.cuda.synchronize()  # expect: FC101
        logits = entry.out[:n]
        self.static_bufs["logits"] = torch.empty_like(logits)  # expect: FC107
        self.static_bufs["logits"].copy_(logits)
        ids = self._sample(self.static_bufs["logits"], batch)
        return self._commit(ids, logits, batch)

    def run_prefill(self, states: List[RequestState]) -> List[int]:
        batch = build_batch(states, self.device, is_decode=False)
        self.attn.graph_bs = None
        self.attn.init_forward_metadata(batch)
        logits = self.model.forward_extend(batch)
        return self._commit(self._sample(logits, batch), logits, batch)

    def _sample(self, logits: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        n = batch.num_seqs
        if self.top_k_buf.numel() < n:
            self.top_k_buf.resize_(n)  # expect: FC107
        self.top_k_buf[:n].copy_(batch.top_k)
        if self.probs_buf is None:
            self.probs_buf = torch.empty(self.limits.max_seqs, logits.shape[-1], device=self.device)  # ok: FC107
        greedy = logits.argmax(-1)
        if batch.top_k_cpu.max() <= 1:  # ok: FC101
            return greedy
        distinct_k = torch.unique(batch.top_k)  # expect: FC101
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        head = sorted_logits[:, : batch.top_k.max()]  # expect: FC101
        probs = torch.softmax(head, dim=-1)
        sampled = order.gather(1, torch.multinomial(probs, 1)).squeeze(-1)
        logger.debug("top-k groups %s", distinct_k)
        return torch.where(batch.top_k == 1, greedy, sampled)  # ok: FC101

    def _commit(self, ids: torch.Tensor, logits: torch.Tensor, batch: DecodeBatch) -> List[int]:
        n = batch.num_seqs
        self.ids_cpu[:n].copy_(ids)  # expect: FC101
        toks = self.ids_cpu[:n].tolist()  # ok: FC101
        lps = torch.log_softmax(logits.float(), dim=-1).gather(1, ids[:, None]).squeeze(1)
        if self.lp_pinned.numel() < n:
            self.lp_pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)  # ok: FC107
        self.lp_pinned[:n].copy_(lps, non_blocking=True)  # ok: FC101
        vals = self.lp_pinned[:n].tolist()  # expect: FC101
        if any(math.isnan(v) for v in vals):  # ok: FC101
            logger.warning(f"NaN log-probs in step: {lps}")  # expect: FC101
        for st, tok in zip(batch.states, toks):
            st.out_ids.append(tok)
        return toks

    def debug_summary(self) -> Dict[str, list]:
        return {"g_last": self.attn.g_last.cpu().tolist()}  # ok: FC101
