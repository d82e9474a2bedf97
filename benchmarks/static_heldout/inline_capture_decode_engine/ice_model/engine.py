"""The engine: builds the backend its config names and hands it to the model."""
from dataclasses import dataclass, field
from typing import Callable, List

import numpy as np
import torch

from ice import DecodeBatch, EngineConfig
from ice_attn.registry import make_backend
from ice_model.transformer import Transformer


@dataclass
class Request:
    rid: int
    prompt_len: int
    pages: List[int] = field(default_factory=list)
    output: List[int] = field(default_factory=list)
    last_token: int = 0

    @property
    def seq_len(self) -> int:
        return self.prompt_len + len(self.output)

    def reserve_slot(self, page_size: int, alloc_page: Callable[[], int]) -> None:
        # the token written this step lands at position seq_len - 1
        if (self.seq_len - 1) // page_size >= len(self.pages):
            self.pages.append(alloc_page())

    def pages_padded(self, width: int) -> np.ndarray:
        row = np.zeros(width, dtype=np.int32)
        row[: len(self.pages)] = self.pages
        return row


def allocate_kv_caches(cfg: EngineConfig, device: torch.device) -> List[torch.Tensor]:
    shape = (cfg.max_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
    return [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]


class Engine:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.device = torch.device("cuda", cfg.device_id)
        self.backend = make_backend(cfg, self.device)
        for bs, w in self.backend.graph_wrappers.items():
            if not getattr(w, "_use_cuda_graph", False):  # expect: FC103
                raise RuntimeError(f"decode bucket {bs} is not in CUDA-graph mode")
        self.kv_caches = allocate_kv_caches(cfg, self.device)
        self.model = Transformer(cfg, self.backend, self.device, self.kv_caches)
        self._free_pages = list(range(cfg.max_pages - 1, 0, -1))

    def alloc_page(self) -> int:
        if not self._free_pages:
            raise RuntimeError("out of KV pages")
        return self._free_pages.pop()

    def build_decode_batch(self, reqs: List[Request]) -> DecodeBatch:
        lens = np.array([r.seq_len for r in reqs], dtype=np.int32)
        page_table_np = np.stack([r.pages_padded(self.cfg.pages_per_request) for r in reqs])
        seq_lens_cpu = torch.from_numpy(lens)
        ids_cpu = torch.tensor([r.last_token for r in reqs], dtype=torch.int64)
        return DecodeBatch(
            input_ids=ids_cpu.to(self.device, non_blocking=True),
            positions=(seq_lens_cpu - 1).long().to(self.device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            page_table=torch.from_numpy(page_table_np).to(self.device, non_blocking=True),
            page_table_np=page_table_np,
            request_ids=[r.rid for r in reqs],
        )

    def step(self, reqs: List[Request]) -> List[int]:
        for r in reqs:
            r.reserve_slot(self.cfg.page_size, self.alloc_page)
        batch = self.build_decode_batch(reqs)
        with torch.inference_mode():
            logits = self.model.decode(batch)
        self.backend.note_appended(batch.batch_size)
        next_ids = torch.argmax(logits, dim=-1).to("cpu")
        tokens = next_ids.tolist()
        for r, tok in zip(reqs, tokens):
            r.output.append(tok)
            r.last_token = tok
        return tokens
