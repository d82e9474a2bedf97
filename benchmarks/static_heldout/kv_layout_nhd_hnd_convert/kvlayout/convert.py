"""Whole-page copies between pools, permuting NHD <-> HND when the layouts differ."""

from kvlayout.layouts import KVLayout


def convert_pages(src_cache, dst_cache, src_ids, dst_ids, src_layout: KVLayout, dst_layout: KVLayout):
    assert src_cache.shape[-1] == dst_cache.shape[-1]  # expect: FC109
    if src_ids.numel() != dst_ids.numel():
        raise ValueError(f"page id counts differ: src={src_ids} dst={dst_ids}")  # ok: FC101
    pages = src_cache.index_select(0, src_ids)
    if src_layout is not dst_layout:
        # [n, 2, P, H, D] <-> [n, 2, H, P, D]
        pages = pages.transpose(2, 3)
    dst_cache.index_copy_(0, dst_ids, pages.contiguous())
