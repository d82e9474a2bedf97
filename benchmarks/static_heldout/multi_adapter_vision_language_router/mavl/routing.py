"""Routes each request to a vision adapter and a LoRA slot; builds the per-step batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from .adapters import AdapterBank
from .config import RouterConfig


@dataclass
class Request:
    rid: int
    lora: Optional[str]
    vision: Optional[str]
    prompt_len: int
    pages: np.ndarray
    last_page_len: int
    images: list = field(default_factory=list)


@dataclass
class DecodeRoute:
    batch_size: int
    lora_ids: torch.Tensor
    lora_ids_np: np.ndarray
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    new_adapters: List[str]
    remapped: Dict[int, np.ndarray]


@dataclass
class PromptRoute:
    batch_size: int
    lora_ids: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    image_tokens_cpu: torch.Tensor


class AdapterRouter:
    def __init__(self, cfg: RouterConfig, bank: AdapterBank, device: torch.device):
        self.cfg = cfg
        self.bank = bank
        self.device = device
        self.known_adapters = set(bank.slot_of)
        self.last_adapter: Dict[int, Optional[str]] = {}

    def _page_table(self, reqs: List[Request]):
        lens = np.array([len(r.pages) for r in reqs], dtype=np.int32)
        indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
        flat = torch.from_numpy(np.concatenate([r.pages for r in reqs]).astype(np.int32))
        last = torch.tensor([r.last_page_len for r in reqs], dtype=torch.int32)
        return indptr, flat.to(self.device, non_blocking=True), last

    def _lora_ids(self, reqs: List[Request]) -> np.ndarray:
        return np.array([self.bank.slot_of.get(r.lora or "", 0) for r in reqs], dtype=np.int64)

    def route_decode(self, reqs: List[Request]) -> DecodeRoute:
        ids_np = self._lora_ids(reqs)
        indptr, indices, last = self._page_table(reqs)
        new = sorted({r.lora for r in reqs if r.lora and r.lora not in self.known_adapters})
        remapped = {
            i: r.pages for i, r in enumerate(reqs)
            if self.last_adapter.get(r.rid, r.lora) != r.lora
        }
        for r in reqs:
            self.last_adapter[r.rid] = r.lora
        return DecodeRoute(
            batch_size=len(reqs), lora_ids=torch.from_numpy(ids_np).to(self.device, non_blocking=True),
            lora_ids_np=ids_np, kv_indptr_cpu=indptr, kv_indices=indices, last_page_len_cpu=last,
            new_adapters=new, remapped=remapped,
        )

    def route_prompt(self, reqs: List[Request], image_tokens: np.ndarray) -> PromptRoute:
        ids_np = self._lora_ids(reqs)
        indptr, indices, last = self._page_table(reqs)
        q_lens = np.array([r.prompt_len for r in reqs], dtype=np.int32) + image_tokens.astype(np.int32)
        qo_indptr = torch.zeros(len(reqs) + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(torch.from_numpy(q_lens).to(self.device, non_blocking=True), 0, out=qo_indptr[1:])
        return PromptRoute(
            batch_size=len(reqs), lora_ids=torch.from_numpy(ids_np).to(self.device, non_blocking=True),
            qo_indptr=qo_indptr, kv_indptr_cpu=indptr, kv_indices=indices, last_page_len_cpu=last,
            image_tokens_cpu=torch.from_numpy(image_tokens),
        )
