"""Acceptance arithmetic of the worker, checked on small device tensors."""
import torch

from dsv3_mtp.spec import AcceptStats


def check_histogram(stats: AcceptStats, total: int) -> None:
    assert int(stats.hist.sum()) == total  # ok: FC109


def test_accept_length_counts_matching_prefix():
    draft = torch.tensor([[5, 7, 9, 11], [3, 4, 4, 4]], device="cuda")
    target = torch.tensor([[7, 9, 1, 2], [8, 8, 8, 8]], device="cuda")
    matches = (draft[:, 1:] == target[:, :-1]).int()
    accept = torch.cumprod(matches, dim=1).sum(dim=1) + 1
    first = accept[0].item()  # ok: FC101
    stats = AcceptStats(num_draft_steps=3)
    stats.update([first, accept[1].item()])
    check_histogram(stats, 2)
    assert first == 3
