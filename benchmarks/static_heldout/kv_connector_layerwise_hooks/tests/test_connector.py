import numpy as np
import torch

from kvconn.config import ConnectorConfig
from kvconn.metadata import ConnectorMetadataBuilder, slot_range


def test_slot_range_crosses_blocks():
    slots = slot_range(np.array([3, 9], dtype=np.int64), 2, 6, 4)
    assert slots.tolist() == [14, 15, 36, 37]


def test_builder_pads_save_slots():
    cfg = ConnectorConfig(role="producer", block_size=4)
    b = ConnectorMetadataBuilder(cfg, torch.device("cpu"))
    b.add_request("r0", [3, 9], 0, 6)
    meta = b.build()
    req = meta.requests[0]
    assert req.save_slots.numel() % ConnectorMetadataBuilder.SAVE_VECTOR_WIDTH == 0  # ok: FC109
    assert int((req.save_slots >= 0).sum()) == 6
    assert meta.num_saves == 1 and meta.num_loads == 0


def test_builder_consumer_has_no_saves():
    b = ConnectorMetadataBuilder(ConnectorConfig(role="consumer", block_size=4), torch.device("cpu"))
    b.add_request("r1", [1], 0, 3, load_remote=True, remote_engine_id="prefill-0", remote_block_ids=[7])
    meta = b.build()
    assert meta.num_loads == 1
    assert meta.requests[0].save_slots is None
