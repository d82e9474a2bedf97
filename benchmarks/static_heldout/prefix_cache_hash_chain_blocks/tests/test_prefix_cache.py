import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from pcache import hash_request_blocks
from pc_attn.block_table import BlockTable


def test_chained_hashes_share_a_prefix_only():
    a = hash_request_blocks(list(range(64)), 16)
    b = hash_request_blocks(list(range(48)) + [7] * 16, 16)
    assert [h.value for h in a[:3]] == [h.value for h in b[:3]]  # ok: FC109


def test_block_table_commit():
    table = BlockTable(4, 8, torch.device("cuda"))
    table.set_row(0, [3, 4, 5])
    table.set_row(1, [6])
    table.commit([0, 1])
    got = table.num_blocks.tolist()  # ok: FC101
    if got[:2] != [3, 1]:
        raise AssertionError(got)


def test_decode_wrapper_small_workspace():
    workspace = torch.zeros(32 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
