import torch

from swaring import RingPageTable, SWAConfig


def test_ring_recycles_oldest_page():
    cfg = SWAConfig(window=32, page_size=16, max_batch_size=4, num_pages=64)
    ring = RingPageTable(cfg, torch.device("cpu"))
    st = ring.admit("r0", 0, 40)
    before = ring.logical_pages(st).tolist()
    for _ in range(16):
        ring.advance(torch.tensor([0]), torch.tensor([st.seq_len]))
    after = ring.logical_pages(st).tolist()
    assert len(after) == cfg.ring_pages  # ok: FC109
    assert set(after) == set(before)
