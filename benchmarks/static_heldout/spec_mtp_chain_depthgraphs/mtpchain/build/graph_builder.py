"""Per-depth CUDA graph capture and replay for the MTP chain.

Depth ``d``'s graph reads ``static_hidden[d]`` and ``static_tokens[:, d]`` and writes
``static_out[d]``; the attention buffers it reads belong to ``ChainAttention``.
"""

import logging
from typing import TYPE_CHECKING, Dict, List, Tuple

import torch

from mtpchain.config import MTPConfig
from mtpchain.heads import MTPChain

if TYPE_CHECKING:
    from mtpchain_rt.attention import ChainAttention

logger = logging.getLogger(__name__)


class DepthGraphBuilder:
    def __init__(self, cfg: MTPConfig, chain: MTPChain, attn: "ChainAttention", device):
        self.cfg = cfg
        self.chain = chain
        self.attn = attn
        self.device = device
        max_bs = cfg.max_batch_size
        depth = cfg.num_mtp_heads
        self.static_hidden = [
            torch.zeros(max_bs, cfg.hidden_size, dtype=torch.bfloat16, device=device) for _ in range(depth)
        ]
        self.static_tokens = torch.zeros(max_bs, depth, dtype=torch.int64, device=device)
        self.static_seq_lens = [torch.ones(max_bs, dtype=torch.int32, device=device) for _ in range(depth)]
        self.static_out: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]] = {}
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.plan_snapshots: Dict[Tuple[int, int], object] = {}
        self.pool = None

    def _draft_forward(self, d: int, bs: int):
        hidden = self.static_hidden[d][:bs]
        tokens = self.static_tokens[:bs, d]
        return self.chain.depth_forward(d, hidden, tokens, self.attn, bs)

    def capture_depth(self, d: int, bs: int) -> None:
        warm_len = self.static_seq_lens[d][:bs].max().item()  # expect: FC101
        logger.info("capturing MTP depth %d at bs=%d (warm-up len %d)", d, bs, warm_len)
        indptr_np = torch.arange(bs + 1, dtype=torch.int32).numpy()
        last_np = torch.ones(bs, dtype=torch.int32).numpy()
        self.attn.replay_prepare_depth(d, bs, indptr_np, torch.arange(bs, dtype=torch.int32, device=self.device), last_np)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._draft_forward(d, bs)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=stream):
            out = self._draft_forward(d, bs)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[(d, bs)] = g
        self.static_out[(d, bs)] = out
        w = self.attn.graph_wrappers[(d, bs)]
        self.plan_snapshots[(d, bs)] = w._plan_info  # expect: FC103

    def capture_all(self) -> None:
        for bs in reversed(self.cfg.graph_batch_sizes):
            for d in range(self.cfg.num_mtp_heads):
                self.capture_depth(d, bs)

    def replay(self, d: int, bs: int, hidden: torch.Tensor, real_bs: int):
        static_h = self.static_hidden[d]
        if hidden.shape[-1] != static_h.shape[-1] or real_bs > static_h.shape[0]:
            self.static_hidden[d] = torch.empty_like(hidden)  # expect: FC107
        self.static_hidden[d][:real_bs].copy_(hidden[:real_bs])
        self.graphs[(d, bs)].replay()
        h, tok = self.static_out[(d, bs)]
        return h[:real_bs], tok[:real_bs]

    def graph_keys(self) -> List[Tuple[int, int]]:
        return sorted(self.graphs)
