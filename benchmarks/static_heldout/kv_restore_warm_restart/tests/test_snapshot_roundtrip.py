import tempfile

from warmstart.snapshot.manifest import FORMAT_VERSION, SnapshotManifest


def check_roundtrip(directory, manifest):
    manifest.save(directory)
    assert SnapshotManifest.load(directory) == manifest  # ok: FC109


def test_manifest_roundtrip():
    m = SnapshotManifest(
        version=FORMAT_VERSION, num_layers=2, page_size=16, num_kv_heads=8, head_dim=128,
        dtype="torch.bfloat16", used_pages=3, restore_generation=1, graph_batch_sizes=[1, 2],
        requests={"a": [0, 17, 1]}, scheduler_state={"waiting": [], "running": []},
    )
    with tempfile.TemporaryDirectory() as d:
        check_roundtrip(d, m)
