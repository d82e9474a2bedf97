import torch

from embedserve.attn import RaggedEmbedBackend
from embedserve.batch import EmbedBatch, attach_query_prefix, build_embed_batch
from embedserve.config import EmbedConfig
from embedserve.models.encoder import EncoderModel
from embedserve.runner.graph_runner import EmbedGraphRunner


class EmbedModelRunner:
    def __init__(self, cfg: EmbedConfig, device="cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.backend = RaggedEmbedBackend(cfg, self.device)
        self.model = EncoderModel(cfg, self.backend).to(self.device).eval()
        self.graph_runner = EmbedGraphRunner(self.model, self.backend, cfg)
        self.graph_runner.capture_all()

    def embed(self, token_lists, query_prefix_pages=None, prefix_len=0):
        batch = build_embed_batch(token_lists, self.device, max_seq_len=self.cfg.max_seq_len)
        if query_prefix_pages is not None:
            attach_query_prefix(batch, query_prefix_pages, prefix_len, self.device)
        return self.forward(batch)

    def forward(self, batch: EmbedBatch):
        if self.graph_runner.bucket_for(batch) is not None:
            return self.graph_runner.replay(batch)
        self.backend.init_forward_metadata(batch)
        hidden = self.model(batch.input_ids, batch.positions, rerank=batch.is_rerank)
        last = batch.cu_seqlens[1:].long() - 1
        return self.graph_runner.pooler.normalize(hidden.index_select(0, last), len(batch.seq_lens_cpu))

    def to_response(self, embeddings):
        return embeddings.float().cpu().numpy().tolist()  # ok: FC101
