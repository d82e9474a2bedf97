"""Model runner: owns the KV pool and the stand-in model; replays graphs or runs eagerly; samples."""
import logging
from typing import List

import torch
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from backends.flashinfer_backend import FlashInferBackend
from serving.graph_runner import CudaGraphRunner
from tdengine.plan_types import GRAPH_BATCH_SIZES, PAGE_SIZE, ForwardBatch, ServeConfig

logger = logging.getLogger(__name__)


def build_forward_batch(mode: str, rows: List[int], seq_lens: List[int], prefix_lens: List[int],
                        token_ids: List[List[int]], device: str) -> ForwardBatch:
    """The scheduler's per-step batch: device tensors for the kernels, *_cpu mirrors for plan()."""
    seq_cpu, prefix_cpu = torch.tensor(seq_lens, dtype=torch.int32), torch.tensor(prefix_lens, dtype=torch.int32)
    positions = [p for s, ids in zip(seq_lens, token_ids) for p in range(s - len(ids), s)]
    return {"mode": mode, "batch_size": len(rows), "seq_lens_cpu": seq_cpu, "extend_prefix_lens_cpu": prefix_cpu,
            "seq_lens": seq_cpu.to(device), "extend_prefix_lens": prefix_cpu.to(device),
            "extend_seq_lens": (seq_cpu - prefix_cpu).to(device),
            "req_pool_indices": torch.tensor(rows, dtype=torch.int64, device=device),
            "input_ids": torch.tensor([t for ids in token_ids for t in ids], dtype=torch.int64, device=device),
            "positions": torch.tensor(positions, dtype=torch.int64, device=device)}


class TinyModel(nn.Module):
    def __init__(self, cfg: ServeConfig, backend: FlashInferBackend, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.cfg, self.backend, self.kv_caches = cfg, backend, kv_caches
        kw, hq, hk, d = dict(device=cfg.device, dtype=torch.bfloat16), cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.split = [hq * d, hk * d, hk * d]
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **kw)
        self.qkv = nn.ModuleList(nn.Linear(cfg.hidden_size, sum(self.split), bias=False, **kw) for _ in kv_caches)
        self.o_proj = nn.ModuleList(nn.Linear(hq * d, cfg.hidden_size, bias=False, **kw) for _ in kv_caches)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **kw)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mode: str, meta) -> torch.Tensor:
        h, (hq, hk, d) = self.embed(input_ids), (self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim)
        for i, kv in enumerate(self.kv_caches):  # K/V of the new tokens land in the pool in the qkv epilogue
            q, k, v = self.qkv[i](h).split(self.split, dim=-1)
            q, k = apply_rope_pos_ids(q.view(-1, hq, d), k.view(-1, hk, d), positions)
            if mode == "decode":
                o = self.backend.forward_decode(q, kv, i, meta)
            elif mode == "verify":
                o = self.backend.forward_verify(q, k, v.view(-1, hk, d), kv, meta)
            else:
                o = self.backend.forward_extend(q, k, v.view(-1, hk, d), kv, meta)
            h = h + self.o_proj[i](o.flatten(1))
        return self.lm_head(h)


class ModelRunner:
    def __init__(self, cfg: ServeConfig):
        self.cfg, dev, pages_per_req = cfg, cfg.device, cfg.max_context_len // PAGE_SIZE
        self.req_to_token = torch.zeros(cfg.max_running_requests, pages_per_req, dtype=torch.int32, device=dev)
        pool = cfg.max_running_requests * pages_per_req
        self.kv_caches = [torch.zeros(pool, 2, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=dev)
                          for _ in range(cfg.num_layers)]
        self.attn_backend = FlashInferBackend(cfg, self.req_to_token)
        self.model = TinyModel(cfg, self.attn_backend, self.kv_caches)
        self.attn_backend.warmup()
        self.graph_pool = torch.cuda.graph_pool_handle()
        self.graph_runner = CudaGraphRunner(self)
        self.sampling_workspace = torch.zeros(cfg.max_running_requests * cfg.vocab_size // 8, dtype=torch.uint8, device=dev)  # ok: FC106

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if batch["mode"] != "extend" and batch["batch_size"] <= GRAPH_BATCH_SIZES[-1]:
            return self.graph_runner.replay(batch)
        self.attn_backend.init_forward_metadata(batch)
        return self.model(batch["input_ids"], batch["positions"], batch["mode"], self.attn_backend.forward_meta)

    def sample(self, logits: torch.Tensor, top_k: List[int]) -> List[int]:
        """Top-k sampling on the scheduler thread, after the step's forward."""
        k = torch.tensor(top_k, dtype=torch.int32).to(logits.device, non_blocking=True)
        next_ids = torch.argmax(torch.ops.td.topk_mask(logits, k, self.sampling_workspace), dim=-1)
        if int((next_ids >= self.cfg.vocab_size).sum()):  # ok: FC101
            logger.error("sampled ids outside the vocabulary: %s", next_ids.cpu())  # ok: FC101
        return next_ids.tolist()  # ok: FC101

    def on_verify_done(self, rows: torch.Tensor, accepted: torch.Tensor) -> None:
        """Speculative step finished: rewind the page table to the accepted prefix of every request."""
        self.accepted = accepted.clone()  # ok: FC107
        bufs = self.attn_backend.graph_bufs
        bufs["kv_last_page_len"][: rows.numel()].sub_(self.cfg.num_draft_tokens - accepted)  # expect: FC104

    def free_request(self, start: int, end: int) -> None:
        """A request finished: its pages go back to the pool; padded graph rows must not see them."""
        self.attn_backend.graph_bufs["kv_indices"][start:end] = 0  # expect: FC104
        self.attn_backend.host_bufs["kv_indices"][start:end] = 0  # ok: FC104

    def compact_pages(self, remap: torch.Tensor) -> None:
        """Defragmentation moved pages: rewrite the captured page table through the remap."""
        indices = self.attn_backend.graph_bufs.setdefault("kv_indices", torch.zeros(0, dtype=torch.int32))
        moved = indices.clone()
        moved.copy_(remap[moved.long()])  # ok: FC104
        indices.copy_(moved)  # expect: FC104

    def debug_wrappers(self) -> dict:
        assert self.graph_runner is not None, "no graphs captured"  # ok: FC109
        out = {}
        for bs, w in self.attn_backend.graph_wrappers.items():
            out[bs] = w.__dict__.get("_paged_kv_last_page_len_buf") is not None  # expect: FC103
        setattr(self.attn_backend.window_wrapper, "_use_cuda_graph", False)  # expect: FC103
        return out
