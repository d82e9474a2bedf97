"""Micro-benchmark of prompt-cache lookups and copy-in."""
import time

import torch

from ecache import EmbeddingLRU, ServerConfig, prompt_hash
from ec_attn.copy_in import copy_cached_prefix


def bench_copy_in(n_prompts: int = 64, prompt_len: int = 512, iters: int = 20) -> float:
    cfg = ServerConfig(cache_slots=n_prompts, max_cached_prompt_len=prompt_len)
    dev = torch.device("cuda")
    lru = EmbeddingLRU(cfg, dev)
    pages_per = cfg.pages_per_cached_prompt
    for i in range(n_prompts):
        key = prompt_hash(list(range(i, i + prompt_len)))
        lru.insert(key, torch.randn(prompt_len, cfg.hidden_size, dtype=torch.bfloat16, device=dev),
                   torch.randn(pages_per, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                               dtype=torch.bfloat16, device=dev))
    kv0 = torch.zeros(n_prompts * pages_per + 1, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                      dtype=torch.bfloat16, device=dev)
    out = torch.empty(n_prompts * prompt_len, cfg.hidden_size, dtype=torch.bfloat16, device=dev)
    hits = [(i, list(range(1 + i * pages_per, 1 + (i + 1) * pages_per))) for i in range(n_prompts)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        plan = copy_cached_prefix(lru, kv0, hits, out, dev)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / iters
    copied = lru.hits_dev.sum().item()  # ok: FC101
    assert plan.n_tokens == n_prompts * prompt_len, copied  # ok: FC109
    return dt


if __name__ == "__main__":
    print(f"copy-in: {bench_copy_in() * 1e3:.2f} ms")
