from __future__ import annotations

import torch

from knnserve.attn import KnnAttnBackend
from knnserve.datastore.ivf_index import IVFFlatIndex
from knnserve.interpolate import KnnInterpolator
from knnserve.model import KnnLM
from knnserve.runner import KnnModelRunner
from knnserve.settings import KnnServeSettings


def build_runner(settings: KnnServeSettings, datastore_path: str, device: str = "cuda") -> KnnModelRunner:
    dev = torch.device(device)
    blob = torch.load(datastore_path, map_location="cpu")
    index = IVFFlatIndex(blob["centroids"], blob["keys"], blob["vals"], blob["list_cap"], settings.nprobe, dev)
    attn = KnnAttnBackend(settings, dev)
    shape = (settings.num_pages, 2, settings.page_size, settings.num_kv_heads, settings.head_dim)
    attn.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=dev) for _ in range(settings.num_layers)]
    model = KnnLM(settings, attn).to(dev).to(torch.bfloat16)
    runner = KnnModelRunner(settings, model, attn, index, KnnInterpolator(settings, dev), dev)
    runner.record_graphs()
    return runner
