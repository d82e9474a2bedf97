import numpy as np
import torch

from ubr import ModelConfig, build_step_batch
from ubr_backends.registry import BACKENDS, available_backends


def test_indptr_counts_pages():
    page_table = np.arange(12, dtype=np.int32).reshape(3, 4)
    batch = build_step_batch(
        np.zeros(3, dtype=np.int64), np.array([1, 16, 17], dtype=np.int32), page_table, 16, torch.device("cpu")
    )
    counts = batch.kv_indptr.tolist()  # ok: FC101
    assert counts == [0, 1, 2, 4]  # ok: FC109


def test_every_config_string_resolves():
    cfg = ModelConfig()
    assert cfg.backend in BACKENDS
    assert "trtllm_gen" in available_backends()
