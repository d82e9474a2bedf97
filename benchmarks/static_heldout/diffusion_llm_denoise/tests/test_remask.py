"""Remasking keeps to its schedule; a finished block has no mask token left."""
import torch

from dllm.remask import Remasker, transfer_schedule

MASK = 126336


def test_schedule_splits_evenly():
    sched = transfer_schedule(torch.tensor([32, 30]), steps=8)
    assert sched.sum(dim=1).tolist() == [32, 30]  # ok: FC109


def test_remask_follows_schedule():
    r = Remasker(MASK, steps=4, max_bs=2, max_block_len=8, device=torch.device("cuda"))
    x = torch.full((2, 8), MASK, device="cuda")
    sched = r.schedule(torch.tensor([8, 8]))
    num_transfer = sched.to("cuda")
    for step in range(4):
        x = r.remask(x, torch.randn(2, 8, 64, device="cuda"), num_transfer, step)
        unmasked = (x != MASK).sum().item()  # ok: FC101
        assert unmasked == int(sched[:, : step + 1].sum())
