"""Host store and connector round trips (needs a GPU)."""
import torch

from lmc_connector.config import ConnectorConfig, EngineLimits
from lmc_connector.storage.host_backend import HostKVStore, chunk_keys


def _small_limits() -> EngineLimits:
    return EngineLimits(num_layers=2, num_kv_heads=2, head_dim=16, block_size=4, num_blocks=64)


def check_roundtrip(store: HostKVStore, keys, staging: torch.Tensor) -> None:
    assert staging.is_pinned()  # ok: FC109
    for layer in range(store.pool.shape[1]):
        store.put_layer(layer, keys, staging)
    assert store.lookup_prefix(keys) == len(keys)


def test_put_and_lookup() -> None:
    cfg = ConnectorConfig(chunk_size=8, host_capacity_bytes=1 << 20)
    store = HostKVStore(cfg, _small_limits())
    keys = chunk_keys(list(range(32)), cfg.chunk_size, "tiny")
    for key in keys:
        store.reserve(key)
    staging = torch.randn(2, 32, 2, 16, dtype=torch.bfloat16).pin_memory()
    check_roundtrip(store, keys, staging)
    dev = staging.cuda()
    assert float((dev - staging.cuda()).abs().max().item()) == 0.0  # ok: FC101
