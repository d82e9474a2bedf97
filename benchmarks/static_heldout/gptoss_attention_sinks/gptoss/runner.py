"""The gpt-oss model and its runner: eager prefill, eager or replayed decode, graph capture."""
import bisect
import logging
from dataclasses import dataclass, field
from typing import Dict, List

import torch
from torch import nn

from gptoss.backend import ForwardBatch, SinkAttnBackend
from gptoss.config import GptOssConfig
from gptoss.layers.attention import SinkAttention
from gptoss.layers.moe import ExpertDispatcher, MoEBlock

logger = logging.getLogger(__name__)


class GptOssBlock(nn.Module):
    def __init__(self, cfg: GptOssConfig, layer_id: int, backend: SinkAttnBackend, dispatcher: ExpertDispatcher):
        super().__init__()
        self.attn = SinkAttention(cfg, layer_id, backend)
        self.moe = MoEBlock(cfg, dispatcher)
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)

    def forward_decode(self, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        h = h + self.attn.forward_decode(self.norm1(h), kv)
        return h + self.moe(self.norm2(h))

    def forward_extend(self, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        h = h + self.attn.forward_extend(self.norm1(h), kv)
        return h + self.moe(self.norm2(h))


class GptOssModel(nn.Module):
    def __init__(self, cfg: GptOssConfig, backend: SinkAttnBackend, device: torch.device):
        super().__init__()
        self.dispatcher = ExpertDispatcher(cfg, device)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([GptOssBlock(cfg, i, backend, self.dispatcher) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_cache = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                        dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for block, kv in zip(self.blocks, self.kv_cache):
            h = block.forward_decode(h, kv)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for block, kv in zip(self.blocks, self.kv_cache):
            h = block.forward_extend(h, kv)
        return self.lm_head(self.norm(h))


@dataclass
class Seq:
    rid: int
    tokens: List[int]
    pages: List[int]
    prompt_len: int
    done: bool = False
    out: List[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.tokens)


class GptOssRunner:
    def __init__(self, cfg: GptOssConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.backend = SinkAttnBackend(cfg, self.device)
        self.model = GptOssModel(cfg, self.backend, self.device).to(self.device)
        self.buckets = sorted(cfg.cuda_graph_bs)
        max_bs = self.buckets[-1]
        self.backend.init_cuda_graph_state(max_bs)
        self.graph_inputs = {
            "input_ids": torch.zeros(max_bs, dtype=torch.int64, device=self.device),
            "positions": torch.zeros(max_bs, dtype=torch.int64, device=self.device),
            "seq_lens": torch.ones(max_bs, dtype=torch.int32, device=self.device),
        }
        self.seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int32)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_out: Dict[int, torch.Tensor] = {}
        self.pool = None

    # ---- capture ------------------------------------------------------------------------------

    def capture_decode_graphs(self) -> None:
        for bs in reversed(self.buckets):
            self.backend.init_forward_metadata_capture_cuda_graph(bs, self.graph_inputs["seq_lens"][:bs])
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                out = self.model.forward_decode(self.graph_inputs["input_ids"][:bs], self.graph_inputs["positions"][:bs])
            self.pool = g.pool()
            self.graphs[bs] = g
            self.graph_out[bs] = out
        logger.info("captured %d decode graphs", len(self.graphs))

    # ---- per step -----------------------------------------------------------------------------

    def _batch(self, seqs: List[Seq], is_decode: bool) -> ForwardBatch:
        cfg = self.cfg
        bs = len(seqs)
        lens = [s.seq_len for s in seqs]
        seq_lens_cpu = torch.tensor(lens, dtype=torch.int32)
        q_lens = [1 if is_decode else s.seq_len for s in seqs]
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        qo_indptr[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0).to(self.device, non_blocking=True)
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr_cpu[1:] = torch.cumsum(torch.tensor([len(s.pages) for s in seqs], dtype=torch.int32), 0)
        max_pages = max(len(s.pages) for s in seqs)
        table = torch.zeros(bs, max_pages, dtype=torch.int32)
        for i, s in enumerate(seqs):
            table[i, : len(s.pages)] = torch.tensor(s.pages, dtype=torch.int32)
        ids = [s.tokens[-1] for s in seqs] if is_decode else [t for s in seqs for t in s.tokens]
        pos = [s.seq_len - 1 for s in seqs] if is_decode else [p for s in seqs for p in range(s.seq_len)]
        return ForwardBatch(
            batch_size=bs,
            is_decode=is_decode,
            input_ids=torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            positions=torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            qo_indptr=qo_indptr,
            kv_indptr_cpu=kv_indptr_cpu,
            kv_indices=torch.tensor([p for s in seqs for p in s.pages], dtype=torch.int32).to(self.device),
            last_page_len_cpu=((seq_lens_cpu - 1) % cfg.page_size + 1).to(torch.int32),
            block_tables=table.to(self.device, non_blocking=True),
        )

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.buckets[bisect.bisect_left(self.buckets, raw_bs)]
        self.graph_inputs["input_ids"][:raw_bs].copy_(fb.input_ids)
        self.graph_inputs["positions"] = fb.positions[:raw_bs].clone()  # expect: FC107
        self.graph_inputs["seq_lens"][:raw_bs].copy_(fb.seq_lens)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.graphs[bs].replay()
        return self.graph_out[bs][:raw_bs]

    def step(self, seqs: List[Seq], is_decode: bool) -> torch.Tensor:
        fb = self._batch(seqs, is_decode)
        bs = fb.batch_size
        self.seq_lens_cpu[:bs] = fb.seq_lens_cpu
        num_live = int(self.seq_lens_cpu[:bs].gt(0).sum())  # ok: FC101
        longest = max(s.seq_len for s in seqs)  # ok: FC101
        if is_decode and bs <= self.buckets[-1] and longest < self.cfg.num_pages * self.cfg.page_size:
            logits = self.replay(fb)
            # the next decode step adds one token to every sequence: bump the page tails now
            self.backend.cuda_graph_last_page_len[:bs].add_(1)  # expect: FC104
        else:
            self.backend.init_forward_metadata(fb)
            if is_decode:
                logits = self.model.forward_decode(fb.input_ids, fb.positions)
            else:
                logits = self.model.forward_extend(fb.input_ids, fb.positions)
                logits = logits.index_select(0, fb.qo_indptr[1:] - 1)
        logger.debug("step: %d live of %d", num_live, bs)
        return logits.argmax(dim=-1)

    def debug_plan_state(self) -> Dict[str, object]:
        info = self.backend.full_decode.__dict__.get("_plan_info")  # expect: FC103
        return {"full_plan_info": info, "graphs": sorted(self.graphs)}
