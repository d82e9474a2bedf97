from dataclasses import dataclass

# Graph-mode decode wrappers share one float workspace across every (batch, beam) bucket.
BEAM_GRAPH_WORKSPACE_BYTES = 192 * 1024 * 1024


@dataclass
class BeamConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_requests: int = 64
    max_beam: int = 8
    max_pages: int = 65536
    max_context: int = 8192
    long_context: int = 4096
    trtllm_workspace_bytes: int = 128 * 1024 * 1024
    batch_buckets: tuple = (1, 2, 4, 8, 16, 32)
    beam_buckets: tuple = (1, 2, 4, 8)
    prune_threshold: float = -30.0
    length_penalty: float = 1.0

    @property
    def max_rows(self) -> int:
        return self.max_requests * self.max_beam

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs: rows x heads x head_dim x fp32 x max chunks
        rows = self.max_rows
        return max(64 << 20, rows * self.num_qo_heads * self.head_dim * 4 * 16)

    def prefill_workspace_bytes(self) -> int:
        return self.max_requests * self.max_context * self.num_qo_heads * 4

    def bucket_for(self, batch: int, beam: int):
        b = next((x for x in self.batch_buckets if x >= batch), None)
        k = next((x for x in self.beam_buckets if x >= beam), None)
        if b is None or k is None:
            return None
        return (b, k)
