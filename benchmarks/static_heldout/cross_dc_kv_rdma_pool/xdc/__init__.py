"""Cross-datacenter KV transfer: manifests, cluster configuration and the RDMA transport."""
from xdc.config import DecodeClusterConfig, PrefillClusterConfig, WsTier
from xdc.manifest import PageManifest, decode_manifest, encode_manifest

__all__ = ["DecodeClusterConfig", "PrefillClusterConfig", "WsTier", "PageManifest", "decode_manifest", "encode_manifest"]
