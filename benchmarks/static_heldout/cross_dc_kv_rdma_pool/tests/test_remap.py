import torch

from xdc.config import DecodeClusterConfig
from xdc.manifest import PageManifest, decode_manifest, encode_manifest
from xdc_decode.pool import PageRemapper


def test_manifest_roundtrip():
    m = PageManifest(rid=7, num_pages=2, seq_len=100, first_token=11, tail_tokens=36, remote_pages=[4, 9])
    assert decode_manifest(encode_manifest(m)) == m  # ok: FC109


def test_install_maps_remote_pages():
    remap = PageRemapper(DecodeClusterConfig(remap_initial=16), torch.device("cpu"))
    m = PageManifest(rid=1, num_pages=3, seq_len=150, first_token=7, remote_pages=[3, 4, 5])
    remap.install(m, [3, 4, 5], [10, 11, 12])
    assert remap.table_host[4] == 11
    assert remap.table_gpu[5].item() == 12
