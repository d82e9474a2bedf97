import torch

from cgt import BucketPolicy, PaddedView, make_decode_batch
from cgt.batch import Request


def test_bucket_policy_rounds_up():
    policy = BucketPolicy((1, 2, 4, 8), (16, 32))
    assert policy.bucket_for(3) == 4  # ok: FC109
    assert policy.is_compiled(16)


def test_padded_view_counts_active_rows():
    reqs = [Request(i, 7, 5 + i, [i]) for i in range(3)]
    batch = make_decode_batch(reqs, 16, 4, torch.device("cuda"))
    view = PaddedView(batch, 4)
    lens = batch.seq_lens.tolist()  # ok: FC101
    assert lens == [5, 6, 7]
    assert view.num_active == 3
