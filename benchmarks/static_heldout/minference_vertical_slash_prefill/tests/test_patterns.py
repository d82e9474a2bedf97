import torch

from mfserve import MInferenceConfig, VerticalSlashEstimator, build_bsr


def test_estimate_keeps_sink_and_diagonal():
    cfg = MInferenceConfig(num_qo_heads=4, num_kv_heads=1, head_dim=64, vertical_size=128, slash_size=128)
    est = VerticalSlashEstimator(cfg, torch.device("cuda"))
    q = torch.randn(512, 4, 64, device="cuda")
    k = torch.randn(512, 1, 64, device="cuda")
    vs = est.estimate(q, k, layer=0)
    layout = build_bsr(vs)
    assert layout.indices[layout.indptr[0]] == 0  # ok: FC109
