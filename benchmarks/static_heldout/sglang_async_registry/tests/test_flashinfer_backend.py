import torch

from sgl_lite.layers.attention.flashinfer_backend import FlashInferAttnBackend


def check_indptr(backend: FlashInferAttnBackend, bs, seq_lens_cpu):
    assert backend.kv_indptr_cpu[bs] == seq_lens_cpu.sum()  # ok: FC109
    workspace = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    return workspace
