import torch

from staratt import merge_all, split_context


def _reference(outs, lses):
    w = torch.softmax(lses, dim=0).unsqueeze(-1)
    return (outs.float() * w).sum(0)


def check_merge(outs, lses, valid, atol):
    merged, _ = merge_all(outs, lses, valid)
    assert torch.allclose(merged.float(), _reference(outs, lses), atol=atol)  # ok: FC109


def test_merge_matches_softmax_over_hosts():
    torch.manual_seed(0)
    outs = torch.randn(4, 8, 2, 64, device="cuda", dtype=torch.float16)
    lses = torch.randn(4, 8, 2, device="cuda")
    valid = torch.ones(4, 8, dtype=torch.bool, device="cuda")
    check_merge(outs, lses, valid, 1e-2)


def test_split_context_round_robin():
    layout = split_context(10000, 4096, 4096, 16, 0, 2, torch.device("cuda"))
    got = layout.block_lens.tolist()  # ok: FC101
    assert got == [4096, 1808]
    assert layout.num_blocks == 2
