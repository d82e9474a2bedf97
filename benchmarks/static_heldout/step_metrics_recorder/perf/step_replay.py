"""Offline replay of recorded steps (mserve.recorder dumps): re-run a step's exact inputs
through a fresh ModelRunner, compare the argmax against the recorded run, and optionally
cross-check decode attention against trtllm-gen.

    python perf/step_replay.py /tmp/steps step000001234-bs32-max2048.npz
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Dict, List

import numpy as np
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mserve.config import EngineConfig
from mserve.forward_batch import ForwardBatch, ForwardMode
from mserve_rt.model_runner import ModelRunner


def load_record(path: str) -> Dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _forward_batch(rec: Dict[str, np.ndarray], device: torch.device, step_id: int) -> ForwardBatch:
    lens = rec["seq_lens"].astype(np.int32)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=int(lens.shape[0]),
        step_id=step_id,
        input_ids=torch.from_numpy(rec["input_ids"]).to(device),
        positions=torch.from_numpy(rec["positions"]).to(device),
        req_pool_indices=torch.from_numpy(rec["req_pool_indices"]).to(device),
        seq_lens=torch.from_numpy(lens).to(device),
        seq_lens_cpu=torch.from_numpy(lens),
        out_cache_loc=torch.from_numpy(rec["out_cache_loc"]).to(device),
    )


def replay_record(runner: ModelRunner, rec: Dict[str, np.ndarray], step_id: int) -> List[int]:
    fb = _forward_batch(rec, runner.device, step_id)
    logits = runner.forward(fb, None)
    return logits.argmax(dim=-1).tolist()  # ok: FC101


def trtllm_cross_check(runner: ModelRunner, rec: Dict[str, np.ndarray], layer: int) -> float:
    cfg = runner.cfg
    lens = rec["seq_lens"].astype(np.int32)
    bs = int(lens.shape[0])
    ws_bytes = bs * cfg.num_heads * (cfg.head_dim + 1) * 4 * 64 + (16 << 20)
    workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=runner.device)  # ok: FC105
    pages = runner.pool.req_to_page[torch.from_numpy(rec["req_pool_indices"]).to(runner.device)]
    q = torch.randn(bs, cfg.num_heads, cfg.head_dim, dtype=getattr(torch, cfg.dtype), device=runner.device)
    kv = runner.pool.kv[layer].transpose(2, 3).contiguous()
    out = trtllm_batch_decode_with_kv_cache(
        q,
        kv,
        workspace,
        pages,
        torch.from_numpy(lens).to(runner.device),
        int(lens.max()),
        bmm1_scale=cfg.head_dim**-0.5,
        bmm2_scale=1.0,
    )
    ref = runner.attn_backend.decode_wrapper.run(q, runner.pool.kv[layer])
    return float((out - ref).abs().max())


def main(argv: List[str]) -> int:
    rec_dir = argv[1]
    pattern = argv[2] if len(argv) > 2 else "step*.npz"
    runner = ModelRunner(EngineConfig(), use_graphs=False)
    mismatches = 0
    for i, path in enumerate(sorted(glob.glob(os.path.join(rec_dir, pattern)))):
        rec = load_record(path)
        toks = replay_record(runner, rec, step_id=i)
        print(f"{os.path.basename(path)}: {len(toks)} rows, first {toks[:4]}")
        if i == 0:
            err = trtllm_cross_check(runner, rec, layer=0)
            mismatches += err > 5e-2
    return int(mismatches > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
