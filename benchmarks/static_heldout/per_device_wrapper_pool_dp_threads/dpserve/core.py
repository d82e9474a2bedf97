"""Limits of the data-parallel engine (one process, one worker thread per GPU) and the batch a worker runs."""

from dataclasses import dataclass, field
from typing import List, Tuple

import numpy as np
import torch

PAGE_SIZE = 16
SWA_WINDOW = 4096
TC_GRAPH_WORKSPACE_BYTES = 192 * 1024 * 1024  # tensor-core graph wrappers, measured once on 8xH100

@dataclass
class DPConfig:
    device_ids: Tuple[int, ...]
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    max_running_per_device: int = 256
    max_pages_per_device: int = 65536
    long_prompt_tokens: int = 32768
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    tensor_core_min_bucket: int = 32
    eos_token_id: int = 2
    fast_plan: bool = True
    use_graphs: bool = True
    prefill_workspace_bytes: int = 384 << 20

    @property
    def max_bucket(self) -> int:
        return max(self.graph_buckets)  # ok: FC101

    @property
    def plan_dims(self) -> Tuple[int, int, int, int]:
        return self.num_qo_heads, self.num_kv_heads, self.head_dim, PAGE_SIZE

def decode_workspace_bytes(cfg: DPConfig) -> int:  # split-k partial outputs and LSEs of the largest batch
    return max(cfg.max_running_per_device * cfg.num_qo_heads * (cfg.head_dim + 1) * 64, 32 << 20)

def context_workspace_bytes(cfg: DPConfig) -> int:
    return cfg.long_prompt_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 8

@dataclass
class Request:
    rid: int
    prompt: List[int]
    max_new_tokens: int
    temperature: float = 0.0
    pages: List[int] = field(default_factory=list)
    cached_tokens: int = 0
    output: List[int] = field(default_factory=list)
    device: int = -1

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.output)

@dataclass
class DeviceBatch:  # one step on GPU `dev`: device tensors beside their `*_cpu` mirrors
    dev: int
    rids: List[int]
    is_prefill: bool
    has_prefix: bool
    input_ids: torch.Tensor
    temperatures: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor

    @property
    def batch_size(self) -> int:
        return len(self.rids)

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr_cpu[-1])  # ok: FC101

    @property
    def max_kv_len(self) -> int:
        return int(self.seq_lens.max())  # expect: FC101

class StepResult:  # what a worker hands the coordinator for one step (built per step)
    def __init__(self, dev: int, rids: List[int], tokens_host: torch.Tensor, device: torch.device):
        self.dev, self.rids, self.tokens_host = dev, rids, tokens_host
        self.event = torch.cuda.Event()
        self.logprobs = torch.empty(len(rids), dtype=torch.float32, device=device)  # ok: FC107
        self.finished: List[int] = []

@torch.jit.script
def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    assert page_size > 0  # ok: FC109
    return (seq_lens - 1) % page_size + 1

def build_device_batch(reqs: List[Request], dev: int, device: torch.device, is_prefill: bool) -> DeviceBatch:
    assert all(len(r.pages) * PAGE_SIZE >= r.seq_len for r in reqs), "pages not reserved"  # expect: FC109
    seq = np.array([r.seq_len for r in reqs], dtype=np.int32)
    if int(np.max(seq)) >= 1 << 20:  # ok: FC101
        raise ValueError(f"a sequence on cuda:{dev} exceeds the position range")
    toks = [(r.prompt + r.output)[r.cached_tokens if is_prefill else -1 :] for r in reqs]
    ext = np.array([len(t) for t in toks], dtype=np.int32)
    ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in toks])
    ids = np.pad(ids, (0, (-len(ids)) % 8)) if is_prefill else ids  # prefill: a multiple of 8 tokens for the QKV GEMM
    pages = (seq + PAGE_SIZE - 1) // PAGE_SIZE
    table = np.zeros((len(reqs), int(pages.max())), dtype=np.int32)
    for i, (r, p) in enumerate(zip(reqs, pages)):
        table[i, :p] = r.pages[:p]
    seq_cpu = torch.from_numpy(seq)
    qo_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(ext)]).astype(np.int32))
    last_cpu = torch.from_numpy((seq - 1) % PAGE_SIZE + 1)
    return DeviceBatch(
        dev=dev, rids=[r.rid for r in reqs], is_prefill=is_prefill, has_prefix=any(r.cached_tokens > 0 for r in reqs),
        input_ids=torch.from_numpy(ids).to(device, non_blocking=True),
        temperatures=torch.tensor([r.temperature for r in reqs]).to(device, non_blocking=True),
        seq_lens=seq_cpu.to(device, non_blocking=True), seq_lens_cpu=seq_cpu,
        qo_indptr=qo_cpu.to(device, non_blocking=True), qo_indptr_cpu=qo_cpu,
        kv_indptr_cpu=torch.from_numpy(np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)),
        kv_indices=torch.from_numpy(np.concatenate([t[:p] for t, p in zip(table, pages)])).to(device, non_blocking=True),
        kv_last_page_len=last_cpu.to(device, non_blocking=True), kv_last_page_len_cpu=last_cpu,
        block_tables=torch.from_numpy(table).to(device, non_blocking=True),
    )
