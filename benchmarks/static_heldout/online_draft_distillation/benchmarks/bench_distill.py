"""How long a draft training step takes, and the ragged train wrapper on its own."""
import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from distill import DistillConfig, DraftTrainer


def time_train_steps(trainer: DraftTrainer, n: int, tokens: int) -> float:
    assert n > 0, "need at least one step"  # ok: FC109
    hidden = torch.randn(tokens, trainer.model.embed.embedding_dim, dtype=torch.bfloat16, device="cuda")
    ids = torch.randint(0, 32000, (tokens,), device="cuda")
    losses = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        losses.append(trainer._train_step(hidden, ids).item())  # ok: FC101
    end.record()
    end.synchronize()
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return start.elapsed_time(end) / n


def bench_ragged(cfg: DistillConfig, iters: int = 20) -> float:
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    indptr = torch.arange(0, cfg.train_batch_tokens + 1, cfg.train_window, dtype=torch.int32)
    w.plan(indptr, indptr, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, causal=True)
    q = torch.randn(cfg.train_batch_tokens, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(cfg.train_batch_tokens, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        w.run(q, kv, kv)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters
