import torch

from bisrv.layers.invariant_ops import log_softmax_invariant


def test_log_softmax_does_not_depend_on_batch():
    torch.manual_seed(0)
    rows = torch.randn(7, 1000)
    alone = log_softmax_invariant(rows[3:4])
    batched = log_softmax_invariant(rows)[3:4]
    assert torch.equal(alone, batched)  # ok: FC109
