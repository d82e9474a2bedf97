import types

import pytest
import torch

from sidemoe.config import ServeConfig
from sidemoe.moe.overlap import SharedExpertOverlap
from sidemoe.streams import SideStreamPair


@pytest.fixture
def cfg_small():
    return ServeConfig(num_layers=1, hidden_size=256, num_experts=8, top_k=2, moe_intermediate=128,
                       shared_intermediate=256, max_num_tokens=64)


def test_overlap_matches_inline(cfg_small):
    assert cfg_small.top_k <= cfg_small.num_experts  # ok: FC109
    dev = torch.device("cuda")
    moe = SharedExpertOverlap(cfg_small, 0, SideStreamPair(dev), dev).to(dev)
    x = torch.randn(16, cfg_small.hidden_size, device=dev)
    moe.prepare_step(types.SimpleNamespace(input_ids=torch.zeros(16, dtype=torch.int64)))
    moe.overlap = False
    ref = moe(x)
    moe.overlap = True
    torch.testing.assert_close(moe(x), ref)
