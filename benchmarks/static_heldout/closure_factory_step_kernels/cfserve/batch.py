"""Requests and the per-step forward batch (device tensors beside pinned / numpy host mirrors)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .config import EngineConfig


@dataclasses.dataclass
class Request:
    rid: int
    prompt: list[int]
    temperature: float = 0.0
    max_new_tokens: int = 128
    output: list[int] = dataclasses.field(default_factory=list)
    pool_idx: int = -1
    prefilled: int = 0  # tokens whose KV is already in the cache
    finished: bool = False

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


@dataclasses.dataclass
class ForwardBatch:
    """One step's inputs. Device tensors feed the kernels; the ``*_cpu`` mirrors are pinned and feed ``plan()``."""

    is_extend: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    extend_lens: torch.Tensor
    extend_lens_cpu: torch.Tensor
    req_pool_idx: torch.Tensor
    temperatures: torch.Tensor
    req_ids_np: np.ndarray
    finished_np: np.ndarray
    all_greedy: bool
    has_prefix: bool
    next_ids: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return int(self.req_ids_np.shape[0])


def make_batch_builder(
    cfg: EngineConfig, device: torch.device, pages_of: Callable[[int], Sequence[int]]
) -> Callable[[Sequence[Request], bool], ForwardBatch]:
    """Returns ``build(reqs, is_extend)``; page lists come from the pool through ``pages_of(rid)``."""
    page = cfg.page_size
    built = 0

    def upload(arr: np.ndarray, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        host = torch.from_numpy(np.ascontiguousarray(arr)).to(dtype).pin_memory()
        return host, host.to(device, non_blocking=True)

    def build(reqs: Sequence[Request], is_extend: bool) -> ForwardBatch:
        nonlocal built
        n = len(reqs)
        seq_lens = np.fromiter((r.seq_len for r in reqs), dtype=np.int32, count=n)
        num_pages = (seq_lens + page - 1) // page
        kv_indptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(num_pages, out=kv_indptr[1:])
        page_lists = [np.asarray(pages_of(r.rid), dtype=np.int32)[:k] for r, k in zip(reqs, num_pages)]
        kv_indices = np.concatenate(page_lists) if n else np.zeros(0, dtype=np.int32)
        last_page_len = (seq_lens - 1) % page + 1

        if is_extend:
            starts = np.fromiter((r.prefilled for r in reqs), dtype=np.int32, count=n)
            ids = np.concatenate([np.asarray(r.tokens[r.prefilled :], dtype=np.int64) for r in reqs])
            positions = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in zip(starts, seq_lens)])
        else:
            starts = seq_lens - 1
            ids = np.fromiter((r.tokens[-1] for r in reqs), dtype=np.int64, count=n)
            positions = starts.astype(np.int64)
        extend_lens = seq_lens - starts
        qo_indptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(extend_lens, out=qo_indptr[1:])

        # slot of every new token: page id * page_size + offset in the page
        token_pages = np.concatenate(
            [pl[(positions[qo_indptr[i] : qo_indptr[i + 1]] // page)] for i, pl in enumerate(page_lists)]
        ) if n else np.zeros(0, dtype=np.int64)
        out_cache_loc = token_pages.astype(np.int64) * page + positions % page

        block_tables = np.zeros((n, cfg.max_pages_per_seq), dtype=np.int32)
        for i, pl in enumerate(page_lists):
            block_tables[i, : pl.shape[0]] = pl

        temps = np.fromiter((r.temperature for r in reqs), dtype=np.float32, count=n)
        seq_lens_cpu, seq_lens_dev = upload(seq_lens, torch.int32)
        kv_indptr_cpu, kv_indptr_dev = upload(kv_indptr, torch.int32)
        last_cpu, last_dev = upload(last_page_len, torch.int32)
        qo_indptr_cpu, qo_indptr_dev = upload(qo_indptr, torch.int32)
        ext_cpu, ext_dev = upload(extend_lens, torch.int32)
        built += 1
        return ForwardBatch(
            is_extend=is_extend,
            input_ids=upload(ids, torch.int64)[1],
            positions=upload(positions, torch.int64)[1],
            out_cache_loc=upload(out_cache_loc, torch.int64)[1],
            seq_lens=seq_lens_dev,
            seq_lens_cpu=seq_lens_cpu,
            kv_indptr=kv_indptr_dev,
            kv_indptr_cpu=kv_indptr_cpu,
            kv_indices=upload(kv_indices, torch.int32)[1],
            kv_last_page_len=last_dev,
            kv_last_page_len_cpu=last_cpu,
            block_tables=upload(block_tables, torch.int32)[1],
            qo_indptr=qo_indptr_dev,
            qo_indptr_cpu=qo_indptr_cpu,
            extend_lens=ext_dev,
            extend_lens_cpu=ext_cpu,
            req_pool_idx=upload(np.array([r.pool_idx for r in reqs], dtype=np.int64), torch.int64)[1],
            temperatures=upload(temps, torch.float32)[1],
            req_ids_np=np.array([r.rid for r in reqs], dtype=np.int64),
            # requests that reach max_new_tokens with this step; the step frees their pages right after it
            finished_np=np.array([len(r.output) + 1 >= r.max_new_tokens for r in reqs], dtype=bool),
            all_greedy=bool((temps <= 0).all()),
            has_prefix=bool((starts > 0).any()) if is_extend else True,
        )

    return build


def dummy_batch(cfg: EngineConfig, bs: int, device: torch.device) -> ForwardBatch:
    """A decode batch of ``bs`` one-token requests on pages 0..bs-1, used to plan before capture."""
    reqs = [Request(rid=-1 - i, prompt=[0], pool_idx=i) for i in range(bs)]
    pages = {r.rid: [i] for i, r in enumerate(reqs)}
    return make_batch_builder(cfg, device, pages.__getitem__)(reqs, False)
