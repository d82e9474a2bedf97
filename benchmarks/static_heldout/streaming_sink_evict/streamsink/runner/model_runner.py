"""Builds the per-step ForwardBatch from the page table and runs the model, graph or eager."""
import numpy as np
import torch
from torch import nn

from streamsink.attention import SinkFlashInferBackend
from streamsink.cache.page_table import SinkWindowPageTable
from streamsink.config import SinkConfig
from streamsink.forward_batch import ForwardBatch
from streamsink.runner.graph_runner import SinkCudaGraphRunner


class SinkModel(nn.Module):
    def __init__(self, cfg: SinkConfig, backend: SinkFlashInferBackend):
        super().__init__()
        self.backend = backend
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.q_proj = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(cfg.num_layers))
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        self.qshape = (-1, cfg.num_qo_heads, cfg.head_dim)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch, use_graph: bool = False):
        h = self.embed(input_ids)
        for i, proj in enumerate(self.q_proj):
            h = h + self.backend.forward_decode(proj(h).view(self.qshape), i, fb, use_graph).reshape(h.shape)
        return self.lm_head(h)

    def extend(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for i, proj in enumerate(self.q_proj):
            h = h + self.backend.forward_extend(proj(h).view(self.qshape), i).reshape(h.shape)
        return self.lm_head(h)


class SinkModelRunner:
    def __init__(self, cfg: SinkConfig, device="cuda"):
        self.cfg = cfg
        self.device = device
        self.attn_backend = SinkFlashInferBackend(cfg, device)
        layout = self.attn_backend.decode_wrapper._kv_layout  # expect: FC103
        page_shape = (cfg.page_size, cfg.num_kv_heads) if layout == "NHD" else (cfg.num_kv_heads, cfg.page_size)
        self.attn_backend.kv_pool = [
            torch.zeros((cfg.num_pages, 2, *page_shape, cfg.head_dim), dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.page_table = SinkWindowPageTable(cfg.sink_pages, cfg.window_pages, cfg.page_size, cfg.num_pages)
        self.model = SinkModel(cfg, self.attn_backend).to(device)
        self.graph_runner = SinkCudaGraphRunner(self)

    def build_decode_batch(self, rids: list[int], input_ids: torch.Tensor, seq_lens_host: np.ndarray) -> ForwardBatch:
        for rid in rids:
            self.page_table.append_token(rid)
        cache_np = np.array([self.page_table.cache_len(r) for r in rids], dtype=np.int32)
        ps = self.cfg.page_size
        return ForwardBatch(
            batch_size=len(rids),
            forward_mode="decode",
            input_ids=input_ids,
            seq_lens=torch.from_numpy(seq_lens_host).to(self.device, non_blocking=True),
            seq_lens_host=seq_lens_host,
            cache_lens=torch.from_numpy(cache_np).to(self.device, non_blocking=True),
            cache_lens_cpu=cache_np,
            window_pages_host=[self.page_table.window_array(r) for r in rids],
            sink_pages_host=np.array([self.page_table.sinks[r] for r in rids], dtype=np.int32),
            last_page_len_host=(cache_np - 1) % ps + 1,
        )

    def forward_decode(self, rids: list[int], input_ids: torch.Tensor, seq_lens_host: np.ndarray):
        fb = self.build_decode_batch(rids, input_ids, seq_lens_host)
        if self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb.input_ids, fb.rope_positions, fb)

    def forward_extend(self, fb: ForwardBatch):
        self.attn_backend.init_forward_metadata(fb)
        return self.model.extend(fb.input_ids, fb.rope_positions)

    def finish(self, rids: list[int], slots: list[int]):
        for rid in rids:
            self.page_table.release(rid)
        # graph rows of finished requests read a one-token last page until the next plan
        slots_gpu = torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True)
        self.attn_backend.kv_last_page_len.index_fill_(0, slots_gpu, 1)  # expect: FC104
