"""Offline length statistics over request traces; run by hand, never by the engine."""

import json
import sys

import numpy as np
import torch

from engine_rt.attention import HelperAttnBackend
from shmirror.config import EngineConfig
from shmirror.helpers.clamp import clamp_lens
from shmirror.helpers.indptr import cumsum_indptr, segment_starts
from shmirror.helpers.pages import pages_per_seq, total_pages


def summarize_trace(path: str, cfg: EngineConfig) -> dict:
    lens_np = np.load(path).astype(np.int32)
    clamped = clamp_lens(lens_np, cfg.max_seq_len)
    indptr = cumsum_indptr(pages_per_seq(clamped, cfg.page_size))
    return {
        "requests": int(lens_np.shape[0]),
        "pages": total_pages(clamped, cfg.page_size),
        "first_offsets": segment_starts(indptr)[:8],
    }


def page_histogram(lens: list, cfg: EngineConfig, device: str = "cuda") -> list:
    lens_dev = torch.tensor(lens, dtype=torch.int32, device=device)
    pages = pages_per_seq(clamp_lens(lens_dev, cfg.max_seq_len), cfg.page_size)
    hist = torch.bincount(pages)
    return hist.tolist()  # ok: FC101


def describe_backend(backend: HelperAttnBackend) -> dict:
    info = {"backend": backend._backend}  # ok: FC103
    info["decode_plan"] = repr(backend.decode_wrapper._plan_info)  # expect: FC103
    info["graph_sizes"] = sorted(backend.graph_wrappers)
    return info


if __name__ == "__main__":
    print(json.dumps(summarize_trace(sys.argv[1], EngineConfig()), indent=2))
