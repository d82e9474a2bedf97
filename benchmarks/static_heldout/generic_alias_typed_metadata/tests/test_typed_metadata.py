import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from tmeta.config import GRAPH_BUCKETS, EngineConfig, bucket_for
from tmeta.generic import BucketTable, MetadataSlot
from tmeta.metadata import DecodeMetadata, total_kv_pages

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _decode_meta(device: str, bs: int = 4) -> DecodeMetadata:
    indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
    last_cpu = torch.ones(bs, dtype=torch.int32)
    return DecodeMetadata(
        batch_size=bs,
        seq_lens=torch.ones(bs, dtype=torch.int32, device=device),
        seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
        kv_indptr=indptr_cpu.to(device),
        kv_indices=torch.arange(bs, dtype=torch.int32, device=device),
        kv_last_page_len=last_cpu.to(device),
        kv_indptr_cpu=indptr_cpu,
        kv_last_page_len_cpu=last_cpu,
    )


def test_bucket_table_put_chains() -> None:
    table: BucketTable[int, str] = BucketTable()
    assert table.put(1, "a").put(2, "b") is table  # ok: FC109
    assert list(table.keys()) == [1, 2]
    assert table.get(3) is None


def test_bucket_for_rounds_up() -> None:
    assert bucket_for(3) == 4
    assert bucket_for(GRAPH_BUCKETS[-1]) == GRAPH_BUCKETS[-1]
    with pytest.raises(ValueError):
        bucket_for(GRAPH_BUCKETS[-1] + 1)


def test_slot_requires_publish() -> None:
    slot: MetadataSlot[DecodeMetadata] = MetadataSlot("decode")
    with pytest.raises(RuntimeError):
        slot.get()
    meta = _decode_meta("cpu")
    assert slot.publish(meta) is meta
    assert slot.generation == 1


def test_split_kv_budget_grows_with_batch() -> None:
    small = EngineConfig(max_batch_size=8)
    large = EngineConfig(max_batch_size=128)
    assert large.split_kv_workspace_bytes() > small.split_kv_workspace_bytes()


@needs_gpu
def test_total_kv_pages_matches_host_mirror() -> None:
    meta = _decode_meta("cuda")
    assert total_kv_pages(meta) == int(meta.kv_indptr_cpu[-1])


@needs_gpu
def test_graph_wrapper_replans_in_place() -> None:
    bs, heads, kv_heads, head_dim, page = 4, 8, 8, 128, 16
    workspace = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC105
    indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda")
    indices = torch.arange(bs, dtype=torch.int32, device="cuda")
    last = torch.ones(bs, dtype=torch.int32, device="cuda")
    wrapper = BatchDecodeWithPagedKVCacheWrapper(
        workspace,
        "NHD",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last,
    )
    wrapper.plan(indptr, indices, last, heads, kv_heads, head_dim, page)  # ok: FC102
    last.fill_(2)  # ok: FC104
    wrapper.plan(indptr.cpu(), indices, last.cpu(), heads, kv_heads, head_dim, page)
    q = torch.randn(bs, heads, head_dim, dtype=torch.float16, device="cuda")
    kv = torch.randn(bs, 2, page, kv_heads, head_dim, dtype=torch.float16, device="cuda")
    out = wrapper.run(q, kv)
    assert out.shape == q.shape
