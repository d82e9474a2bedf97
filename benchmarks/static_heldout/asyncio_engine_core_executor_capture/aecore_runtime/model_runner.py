"""The decoder and the model runner: one step per call in the engine's executor thread, decode graphs per bucket."""
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from aecore.config import EngineConfig
from aecore.request import ModelOutput, StepBatch
from aecore_attn.flashinfer_backend import FlashInferBackend

logger = logging.getLogger(__name__)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferBackend, is_draft: bool = False):
        super().__init__()
        self.layer_id, self.is_draft, self.backend, self._sm_scale = layer_id, is_draft, backend, cfg.head_dim ** -0.5
        self.dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)
        self.qkv = nn.Linear(cfg.num_qo_heads * cfg.head_dim, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)

    def _qkv(self, h: torch.Tensor):
        nq, nkv, d = self.dims
        q, k, v = self.qkv(h).split([nq * d, nkv * d, nkv * d], dim=-1)
        return q.view(-1, nq, d), k.view(-1, nkv, d), v.view(-1, nkv, d)

    def forward_decode(self, h: torch.Tensor) -> torch.Tensor:  # the KV append is fused into the rotary kernel
        return h + self.backend.forward_decode(self._qkv(h)[0], self).flatten(1)

    def forward_extend(self, h: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        q, k, v = self._qkv(h)
        return h + self.backend.forward_extend(q, k, v, self, batch).flatten(1)


class Model(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.num_qo_heads * cfg.head_dim)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.mtp_layers = nn.ModuleList([DecoderLayer(cfg, cfg.num_layers + i, backend, True) for i in range(cfg.num_draft_layers)])
        self.lm_head = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h)
        if torch.isnan(h).any():  # expect: FC101
            raise FloatingPointError("NaN in the decode hidden states")
        draft = h
        for layer in self.mtp_layers:
            draft = layer.forward_decode(draft)
        return self.lm_head(h), self.lm_head(draft) if len(self.mtp_layers) else None

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, batch)
        return h


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        assert cfg.max_num_seqs >= max(cfg.cuda_graph_batch_sizes)  # expect: FC109
        self.cfg, self.device, self.stream = cfg, device, torch.cuda.Stream(device)
        self.attn_backend = FlashInferBackend(cfg, device)
        self.model = Model(cfg, self.attn_backend).to(device)
        self.buckets = tuple(sorted(cfg.cuda_graph_batch_sizes))
        self.graphs: Dict[int, GraphEntry] = {}
        self.static_inputs: Dict[str, torch.Tensor] = {}
        self.graph_pool = None
        self.input_ids_buf = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64, device=device)
        self.sampled_ids = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, device=device)
        self.prompt_lp_cpu = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.float32, pin_memory=True)
        self.prompt_lp_buf: Optional[torch.Tensor] = None
        self.decode_positions: Optional[torch.Tensor] = None

    def compile_graphs(self) -> int:  # start-up, in the executor thread, before requests are served
        torch.cuda.synchronize(self.device)  # ok: FC101
        self.attn_backend.init_cuda_graph_state()
        for bs in sorted(self.buckets, reverse=True):
            self.capture_bucket(bs)
        self.attn_backend.kv_last_page_len.fill_(1)  # expect: FC104
        assert len(self.graphs) == len(self.buckets)  # ok: FC109
        return len(self.graphs)

    def capture_bucket(self, bs: int) -> None:
        if "input_ids" not in self.static_inputs:  # the largest bucket is captured first
            self.static_inputs["input_ids"] = torch.zeros(bs, dtype=torch.int64, device=self.device)  # ok: FC107
            self.static_inputs["positions"] = torch.zeros(bs, dtype=torch.int64, device=self.device)
        input_ids, positions = self.static_inputs["input_ids"][:bs], self.static_inputs["positions"][:bs]
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs)
        for _ in range(2):
            self.model.forward_decode(input_ids, positions)
        torch.cuda.synchronize(self.device)  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            logits, _ = self.model.forward_decode(input_ids, positions)
        self.graph_pool = graph.pool()
        self.graphs[bs] = GraphEntry(graph, input_ids, positions, logits)

    def _bucket(self, n: int) -> int:
        assert n <= self.buckets[-1]  # expect: FC109
        return next(b for b in self.buckets if b >= n)

    def replay(self, batch: StepBatch) -> torch.Tensor:
        n = batch.num_reqs
        bs = self._bucket(n)
        entry = self.graphs[bs]
        logger.debug(f"replay bs={bs} n={n} seq_lens={batch.seq_lens}")  # expect: FC101
        self.attn_backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.attn_backend.kv_indptr[n + 1 : bs + 1].fill_(int(batch.kv_indptr_cpu[n]))  # expect: FC104
        entry.input_ids[:n].copy_(batch.input_ids, non_blocking=True)  # ok: FC104
        entry.positions = torch.cat([batch.positions, entry.positions[n:]])  # expect: FC107
        entry.graph.replay()
        return entry.logits[:n]

    def execute_model(self, batch: StepBatch) -> ModelOutput:  # every step, in the executor thread
        with torch.cuda.stream(self.stream):
            if batch.is_prefill:  # ok: FC101
                return self._execute_prefill(batch)
            return self._execute_decode(batch)

    def _execute_prefill(self, batch: StepBatch) -> ModelOutput:
        num_tokens = int(batch.query_start_loc_cpu[-1])  # ok: FC101
        if self.input_ids_buf.numel() < num_tokens:
            self.input_ids_buf = torch.empty(num_tokens, dtype=torch.int64, device=self.device)  # expect: FC107
        self.input_ids_buf[:num_tokens].copy_(batch.input_ids, non_blocking=True)
        self.attn_backend.cu_seqlens_q = batch.query_start_loc.clone()  # expect: FC107
        self.attn_backend.init_forward_metadata(batch)
        hidden = self.model.forward_extend(self.input_ids_buf[:num_tokens], batch.positions, batch)
        out = self._sample(batch, self.model.lm_head(hidden[batch.query_start_loc[1:] - 1]))  # ok: FC101
        if self.cfg.return_prompt_logprobs:
            out.prompt_logprobs = self._prompt_logprobs(batch, hidden, num_tokens)
        return out

    def _prompt_logprobs(self, batch: StepBatch, hidden: torch.Tensor, num_tokens: int) -> List[float]:
        if self.prompt_lp_buf is None or self.prompt_lp_buf.numel() < num_tokens:
            self.prompt_lp_buf = torch.empty(num_tokens, dtype=torch.float32, device=self.device)  # expect: FC107
        query_lens = batch.query_start_loc.diff()
        temps = torch.repeat_interleave(batch.temperature, query_lens)  # expect: FC101
        req_of = torch.repeat_interleave(torch.arange(batch.num_reqs, device=self.device), query_lens, output_size=num_tokens)  # ok: FC101
        lp = torch.log_softmax(self.model.lm_head(hidden).float() / temps.clamp_min(1e-5)[:, None], dim=-1)
        self.prompt_lp_buf[:num_tokens].copy_(lp.gather(1, torch.roll(self.input_ids_buf[:num_tokens], -1)[:, None]).squeeze(1))
        self.prompt_lp_buf[:num_tokens].masked_fill_(torch.roll(req_of, -1) != req_of, 0.0)
        self.prompt_lp_cpu[:num_tokens].copy_(self.prompt_lp_buf[:num_tokens], non_blocking=True)  # ok: FC101
        return self.prompt_lp_cpu[:num_tokens].tolist()  # expect: FC101

    def _execute_decode(self, batch: StepBatch) -> ModelOutput:
        n = batch.num_reqs
        if n <= max(self.buckets):  # ok: FC101
            logits = self.replay(batch)
        else:
            if self.decode_positions is None:
                self.decode_positions = torch.zeros(self.cfg.max_num_seqs, dtype=torch.int64, device=self.device)  # ok: FC107
            self.decode_positions[:n].copy_(batch.positions, non_blocking=True)
            self.attn_backend.init_forward_metadata(batch)
            logits, _ = self.model.forward_decode(batch.input_ids, self.decode_positions[:n])
        out = self._sample(batch, logits)
        self.attn_backend.kv_last_page_len[:n].add_(1)  # expect: FC104
        torch.cuda.synchronize()  # expect: FC101
        return out

    def _sample(self, batch: StepBatch, logits: torch.Tensor) -> ModelOutput:
        greedy_rows = batch.temperature == 0
        temps = torch.where(greedy_rows, torch.ones_like(batch.temperature), batch.temperature)  # ok: FC101
        ids = torch.multinomial(torch.softmax(logits.float() / temps[:, None], dim=-1), 1).squeeze(-1)
        ids[greedy_rows] = logits.argmax(dim=-1)[greedy_rows]  # expect: FC101
        self.sampled_ids.resize_(batch.num_reqs)  # expect: FC107
        self.sampled_ids.copy_(ids)
        logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, None]).squeeze(-1)
        out = ModelOutput(self.sampled_ids, logprobs, ids == self.cfg.eos_token_id, torch.cuda.Event(), batch.num_reqs)
        out.done_event.record(self.stream)
        return out

    def free_request(self, pages: List[int]) -> None:  # event loop: scrub freed pages from the page table
        bufs = self.attn_backend.graph_bufs
        freed = torch.tensor(pages, dtype=torch.int32, device=self.device)
        bufs["kv_indices"].masked_fill_(torch.isin(bufs["kv_indices"], freed), 0)  # expect: FC104

    def load_prefix_pages(self, pages: List[int]) -> None:  # pin the system prompt's pages at the table head
        self.attn_backend.kv_indices[: len(pages)].copy_(torch.tensor(pages, dtype=torch.int32))  # expect: FC104
