import logging
from typing import Dict, Optional

import torch

from tts_attn.backends import DepthAttention, TextAttention
from ttscore.config import TTSConfig

from .depth import DepthDecoder
from .text_lm import TextLM

logger = logging.getLogger(__name__)


class TTSGraphRunner:
    def __init__(self, cfg: TTSConfig, lm: TextLM, depth: DepthDecoder, text_attn: TextAttention,
                 depth_attn: DepthAttention, kv_cache: torch.Tensor):
        self.cfg = cfg
        self.lm = lm
        self.depth = depth
        self.text_attn = text_attn
        self.depth_attn = depth_attn
        self.kv_cache = kv_cache
        dev = text_attn.device
        self.static_tokens = torch.zeros(cfg.max_streams, dtype=torch.int64, device=dev)
        self.static_prev = torch.zeros(cfg.max_streams, cfg.num_codebooks, dtype=torch.int64, device=dev)
        self.static_codes: Optional[torch.Tensor] = None
        self.kv_lens_host = torch.zeros(cfg.max_streams, dtype=torch.int32)
        self.text_graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.text_out: Dict[int, torch.Tensor] = {}

    def capture_text_graphs(self) -> None:
        for bs in sorted(self.cfg.stream_buckets, reverse=True):
            g = torch.cuda.CUDAGraph()
            self.text_attn.plan_graph_decode(bs, bs, self._dummy_indptr(bs), self.text_attn.bufs.kv_indices[:bs],
                                             self._dummy_last(bs))
            with torch.cuda.graph(g):
                self.text_out[bs] = self.lm(self.static_tokens[:bs], self.static_prev[:bs], self.kv_cache, bs)
            self.text_graphs[bs] = g

    def capture_depth_graphs(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        d = self.depth
        d.static_in = torch.zeros(self.cfg.max_streams, self.lm.norm.normalized_shape[0], device=self.text_attn.device)
        for bs in sorted(self.cfg.stream_buckets, reverse=True):
            self.depth_attn.plan_frame_graph(bs)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                d.static_out[bs] = d(d.static_in[:bs])
            d.graphs[bs] = g

    @staticmethod
    def _dummy_indptr(bs: int):
        import numpy as np
        return np.arange(bs + 1, dtype=np.int32)

    @staticmethod
    def _dummy_last(bs: int):
        import numpy as np
        return np.ones(bs, dtype=np.int32)

    def replay_text(self, bs: int, padded: int, tokens: torch.Tensor, prev_codes: torch.Tensor,
                    kv_lens_dev: torch.Tensor, plan_args: tuple) -> torch.Tensor:
        self.text_attn.plan_graph_decode(bs, padded, *plan_args)
        self.static_tokens[:bs].copy_(tokens, non_blocking=True)
        self.static_prev[:bs].copy_(prev_codes, non_blocking=True)
        setattr(self, "static_codes", torch.zeros_like(prev_codes))  # expect: FC107
        self.kv_lens_host[:bs].copy_(kv_lens_dev)  # expect: FC101
        self.text_graphs[padded].replay()
        return self.text_out[padded][:bs]
