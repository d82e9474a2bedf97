import torch
from flashinfer import MultiLevelCascadeAttentionWrapper

from kvbatch import LinearCostModel


def test_linear_cost_on_host_lengths():
    model = LinearCostModel(per_token_us=0.002, per_row_us=1.5, fixed_us=40.0)
    lens = torch.tensor([100, 200, 300])
    assert abs(model.estimate(lens) - (0.002 * 600 + 4.5 + 40.0)) < 1e-6  # ok: FC109


def test_cascade_wrapper_accepts_small_workspace():
    workspace = torch.zeros(16 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = MultiLevelCascadeAttentionWrapper(2, workspace, "HND")
    assert w is not None
