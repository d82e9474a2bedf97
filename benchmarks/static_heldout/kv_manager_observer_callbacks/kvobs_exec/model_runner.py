"""Model, the CUDA graph runner (one graph per decode bucket) and the model runner; the graph runner
observes the KV block manager too."""
import logging
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from kvobs import DECODE_BUCKETS, ServerConfig
from kvobs.block_manager import BlockManager
from kvobs_attn.flashinfer_backend import FlashInferAttnBackend
from kvobs_attn.kernels import remap_pages
from kvobs_sched.scheduler import ForwardBatch, Scheduler

logger = logging.getLogger(__name__)
_REFRESHED_INPUTS = ("input_ids",)


class AttentionLayer(nn.Module):
    def __init__(self, cfg: ServerConfig, layer_id: int, backend: FlashInferAttnBackend, is_draft: bool = False):
        super().__init__()
        self.layer_id, self.is_draft, self.backend = layer_id, is_draft, backend
        self._logits_soft_cap = cfg.logits_soft_cap if layer_id in cfg.softcap_layers else 0.0
        self.dims = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        self.qkv = nn.Linear(cfg.num_heads * cfg.head_dim, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)

    def _split(self, h: torch.Tensor):
        nq, nkv, d = self.dims
        q, k, v = self.qkv(h).split([nq * d, nkv * d, nkv * d], dim=-1)
        return q.view(-1, nq, d), k.view(-1, nkv, d), v.view(-1, nkv, d)

    def forward_decode(self, h: torch.Tensor, graph_bs: Optional[int] = None) -> torch.Tensor:
        return h + self.backend.forward_decode(self._split(h)[0], self, graph_bs).flatten(1)

    def forward_extend(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(h)
        return h + self.backend.forward_extend(q, k, v, self).flatten(1)


class Model(nn.Module):
    def __init__(self, cfg: ServerConfig, backend: FlashInferAttnBackend):
        super().__init__()
        self.max_context = cfg.max_context
        self.embed = nn.Embedding(cfg.vocab_size, cfg.num_heads * cfg.head_dim)
        self.layers = nn.ModuleList([AttentionLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.layers.extend(AttentionLayer(cfg, cfg.num_layers + i, backend, is_draft=True) for i in range(cfg.num_draft_layers))
        self.lm_head = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, graph_bs: Optional[int] = None) -> torch.Tensor:
        if (positions >= self.max_context).any():  # expect: FC101
            raise IndexError("decode position beyond the rotary cache")
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, graph_bs)
        return self.lm_head(torch.where(torch.isfinite(h), h, torch.zeros_like(h)))  # ok: FC101

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h)
        return self.lm_head(h)


class CudaGraphRunner:
    def __init__(self, model: Model, backend: FlashInferAttnBackend, bm: BlockManager, device: torch.device):
        self.model, self.attn_backend, self.bm, self.device = model, backend, bm, device
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs = {bs: torch.empty(bs, model.lm_head.out_features, device=device) for bs in DECODE_BUCKETS}
        self.input_ids: Optional[torch.Tensor] = None
        self.positions: Optional[torch.Tensor] = None
        self.rows_host = torch.zeros(max(DECODE_BUCKETS), dtype=torch.int32, pin_memory=True)
        self.last_rows: List[int] = []
        self.last_batch: Optional[Tuple[ForwardBatch, int]] = None
        bm.compacted.add(self.on_compaction, weak=True)
        bm.request_aborted.add(self.on_request_aborted, weak=True)

    def capture(self) -> None:
        self.input_ids = torch.zeros(max(DECODE_BUCKETS), dtype=torch.int64, device=self.device)  # ok: FC107
        self.positions = torch.zeros_like(self.input_ids)
        self.attn_backend.init_cuda_graph_state()
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(DECODE_BUCKETS):
            self.capture_one_batch_size(bs)
        assert len(self.graphs) == len(DECODE_BUCKETS)  # ok: FC109

    def capture_one_batch_size(self, bs: int) -> None:
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs)
        ids, pos = self.input_ids[:bs], self.positions[:bs]
        self.model.forward_decode(ids, pos, bs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs[bs].copy_(self.model.forward_decode(ids, pos, bs))
        if not torch.isfinite(self.outputs[bs]).all():  # expect: FC101
            raise RuntimeError(f"bucket {bs} produced non-finite logits during capture")
        self.attn_backend.graph_bufs["kv_last_page_len"][:bs].fill_(1)  # expect: FC104
        self.graphs[bs] = graph

    def _pad(self, n: int) -> int:
        assert n <= DECODE_BUCKETS[-1]  # expect: FC109
        return next(b for b in DECODE_BUCKETS if b >= n)  # ok: FC101

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        n = fb.batch_size
        bs = self._pad(n)
        torch.cuda.current_stream().wait_stream(self.bm.copy_stream)  # ok: FC101
        logger.debug(f"replay bs={bs} seq_lens={fb.seq_lens}")  # expect: FC101
        for name in _REFRESHED_INPUTS:
            setattr(self, name, torch.cat([getattr(fb, name), getattr(self, name)[n:]]))  # expect: FC107
        self.positions[:n].copy_(fb.positions, non_blocking=True)  # ok: FC104
        self.attn_backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.attn_backend.graph_indptr[n + 1 : bs + 1].fill_(int(fb.kv_indptr_cpu[n]))  # expect: FC104
        self.attn_backend.long_seq_lens = fb.seq_lens.new_zeros(bs)  # expect: FC107
        if self.rows_host.numel() < n:
            self.rows_host = torch.empty(2 * n, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.rows_host[:n].copy_(fb.rows, non_blocking=True)  # ok: FC101
        self.last_rows, self.last_batch = self.rows_host[:n].tolist(), (fb, bs)  # expect: FC101
        self.graphs[bs].replay()
        self.outputs[bs] = self.outputs[bs].clone()  # expect: FC107
        return self.outputs[bs][:n]

    # -- block-manager observers (weak: a dropped runner stops listening) ----------------------
    def on_compaction(self, remap: torch.Tensor) -> None:
        if self.last_batch is not None:  # patch the live page table so the next replay can reuse it
            fb, _ = self.last_batch
            remap_pages(self.attn_backend.kv_indices, remap.to(self.device), int(fb.kv_indptr_cpu[fb.batch_size]))  # expect: FC104

    def on_request_aborted(self, rid: str, row: int, num_pages: int) -> None:
        if self.last_batch is not None and row in self.last_rows:  # re-upload the page table the graphs read
            fb, bs = self.last_batch
            self.attn_backend.load_graph_inputs(fb, bs)  # expect: FC104


class ModelRunner:
    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.block_manager = BlockManager(cfg, device)
        self.attn_backend = FlashInferAttnBackend(cfg, device, self.block_manager)
        self.model = Model(cfg, self.attn_backend).to(device)
        self.graph_runner = CudaGraphRunner(self.model, self.attn_backend, self.block_manager, device)
        self.scheduler = Scheduler(cfg, self.block_manager, device)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_decode() and fb.batch_size <= DECODE_BUCKETS[-1]:
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode.is_decode():
            return self.model.forward_decode(fb.input_ids, fb.positions)
        return self.model.forward_extend(fb.input_ids, fb.positions)[fb.qo_indptr[1:] - 1]

    def step(self) -> List[str]:
        if (fb := self.scheduler.next_batch()) is None:
            return []
        by_rid, done = {r.rid: r for r in self.scheduler.running}, []
        for rid, tok in zip(fb.rids, self.forward(fb).argmax(dim=-1).tolist()):  # ok: FC101
            req = by_rid[rid]
            req.output_ids.append(tok)
            if len(req.output_ids) >= req.max_new_tokens:
                self.scheduler.finish(req)  # frees the pages: the block manager's observers run here
                done.append(rid)
        self.block_manager.maybe_compact()
        return done
