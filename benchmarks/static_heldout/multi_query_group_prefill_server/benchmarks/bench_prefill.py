"""Times the LSE merge of a packed chunk against its cached prefix."""
import torch

from mqg_attn.merge import merge_chunk_outputs


def bench_merge(tokens: int = 8192, heads: int = 32, head_dim: int = 128, iters: int = 50) -> float:
    o = torch.randn(tokens, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    lse = torch.randn(tokens, heads, dtype=torch.float32, device="cuda")
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        out, _ = merge_chunk_outputs(o, lse, o, lse)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / iters
    checksum = out.float().abs().sum().item()  # ok: FC101
    assert ms > 0.0 and checksum > 0.0, "timer or merge produced nothing"  # ok: FC109
    return ms
