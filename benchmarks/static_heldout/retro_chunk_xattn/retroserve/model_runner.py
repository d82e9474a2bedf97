import torch

from retroserve.attn_backend import NeighbourEncoderAttention, RetroAttnBackend, RetroForwardBatch
from retroserve.cuda_graph_runner import CudaGraphRunner
from retroserve.model import RetroModel
from retroserve.retrieval.neighbours import NeighbourStore
from retroserve.settings import RetroSettings


class ModelRunner:
    def __init__(self, settings: RetroSettings, store: NeighbourStore, device="cuda"):
        self.settings = settings
        self.device = device
        self.store = store
        self.attn_backend = RetroAttnBackend(settings, device)
        self.encoder_attn = NeighbourEncoderAttention(settings, device)
        self.model = RetroModel(settings, self.attn_backend).to(device)
        self.kv_caches = [
            torch.zeros(settings.max_pages, 2, settings.page_size, settings.num_kv_heads, settings.head_dim,
                        dtype=torch.bfloat16, device=device)
            for _ in range(24)
        ]
        self.graph_runner = CudaGraphRunner(self)

    def dummy_batch(self, bs: int) -> RetroForwardBatch:
        s = self.settings
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        return RetroForwardBatch(
            batch_size=bs,
            is_decode=True,
            input_ids=torch.zeros(bs, dtype=torch.long, device=self.device),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            qo_indptr_cpu=indptr_cpu,
            kv_indptr=indptr_cpu.to(self.device),
            kv_indptr_cpu=indptr_cpu,
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
            kv_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
            chunk_qo_indptr_cpu=torch.zeros(bs + 1, dtype=torch.int32),
            neighbour_kv_indptr=torch.zeros(bs + 1, dtype=torch.int32, device=self.device),
            chunk_ids=torch.zeros(0, dtype=torch.long, device=self.device),
            chunk_counts=torch.zeros(0, dtype=torch.long, device=self.device),
            num_chunk_tokens=0,
            neighbour_states=torch.zeros(bs, s.num_heads * s.head_dim, device=self.device),
        )

    def encode_neighbours(self, fb: RetroForwardBatch, chunk_embs, nb_block_tables, nb_lens_gpu, nb_indptr_gpu):
        n = nb_indptr_gpu.shape[0] - 1
        neighbours = self.store.lookup(chunk_embs, self.settings.num_neighbours)
        self.attn_backend.kv_indptr[: n + 1].copy_(nb_indptr_gpu)  # expect: FC104
        fb.neighbour_states = self.encoder_attn.encode(
            neighbours, self.kv_caches[0], nb_block_tables, nb_lens_gpu, self.settings.neighbour_len
        )
        return fb

    def forward(self, fb: RetroForwardBatch):
        if fb.is_decode and fb.batch_size in self.graph_runner.graphs:
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb.input_ids, self.kv_caches, fb)
