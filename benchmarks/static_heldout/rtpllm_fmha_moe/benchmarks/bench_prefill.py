import time

import torch

from rtp_llm.models_py.modules.fmha.attn_inputs import build_attn_inputs


def benchmark_plan(op, config, iters=100):
    inputs = build_attn_inputs([512] * 8, [512] * 8, [0] * 8, [[i] for i in range(8)], "cuda")
    torch.cuda.synchronize()  # ok: FC101
    start = time.perf_counter()
    for _ in range(iters):
        op.prepare(inputs)
    torch.cuda.synchronize()  # ok: FC101
    total = inputs.cu_seqlens[-1].item()  # ok: FC101
    return (time.perf_counter() - start) / iters, total
