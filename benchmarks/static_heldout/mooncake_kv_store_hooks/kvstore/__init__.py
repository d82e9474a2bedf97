"""Client side of the distributed KV store: page hashing, the transfer engine and the store client."""

from kvstore.config import DECODE_WORKSPACE_BYTES, StoreConfig
from kvstore.hashing import hex_keys, page_hashes
from kvstore.store_client import MooncakeStoreClient
from kvstore.transfer_engine import TransferEngine

__all__ = [
    "DECODE_WORKSPACE_BYTES",
    "MooncakeStoreClient",
    "StoreConfig",
    "TransferEngine",
    "hex_keys",
    "page_hashes",
]
