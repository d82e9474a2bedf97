import torch

from srt.layers.draft_attn import MultiStepDraftBackend


class EagleDraftWorker:
    def __init__(self, model_runner, server_args):
        self.model_runner = model_runner
        self.num_steps = server_args.speculative_num_steps
        self.draft_backend = MultiStepDraftBackend(model_runner, server_args.speculative_eagle_topk, self.num_steps)
        self.hidden_states_buf = torch.zeros(model_runner.max_bs, model_runner.hidden_size, device=model_runner.device)
        self.accept_length = torch.zeros(model_runner.max_bs, dtype=torch.int32, device=model_runner.device)
        self.accept_length_cpu = torch.zeros(model_runner.max_bs, dtype=torch.int32, pin_memory=True)

    def draft_forward(self, bs, seq_lens_cpu, topk_p, verified_id):
        accepted = self.accept_length[:bs].tolist()  # expect: FC101
        accepted_cpu = self.accept_length_cpu[:bs].tolist()  # ok: FC101
        (finished,) = torch.where(verified_id[:bs] == self.model_runner.eos_token_id)  # expect: FC101
        if self.hidden_states_buf[:bs].isnan().any():  # expect: FC101
            raise FloatingPointError("draft hidden states contain NaN")
        new_lens = torch.tensor(accepted_cpu, dtype=torch.int32, device=self.model_runner.device)
        self.draft_backend.kv_indptr[-1, 1 : bs + 1] = torch.cumsum(new_lens, 0)  # expect: FC104
        self.draft_backend.init_forward_metadata_replay_cuda_graph(bs, seq_lens_cpu)  # ok: FC104
        for step in range(self.num_steps):
            topk_p = torch.softmax(topk_p, dim=-1)
        return accepted, finished, topk_p


class DraftGraphRunner:
    def __init__(self, worker: EagleDraftWorker, capture_bs=(1, 2, 4, 8)):
        self.worker = worker
        self.capture_bs = capture_bs
        self.graphs = {}

    def warm_and_record(self, q, kv_cache):
        backend = self.worker.draft_backend
        for bs in self.capture_bs:
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = [b.forward_decode(q[:bs], kv_cache) for b in backend.attn_backends]
                outs.append(backend.attn_backends[0].forward_verify(q[:bs], kv_cache))
            self.graphs[bs] = (graph, outs)
