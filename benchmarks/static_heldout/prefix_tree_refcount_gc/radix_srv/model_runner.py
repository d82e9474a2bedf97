import torch

from radix_srv.cuda_graph_runner import CudaGraphRunner
from radix_srv.flashinfer_backend import RadixFlashInferBackend
from radix_srv.forward_batch import ForwardMode
from radix_srv.model import RadixLM
from radix_srv.server_args import ServerArgs
from radixkv.gc import PageGC
from radixkv.refcount import PageRefCounter
from radixkv.tree import RadixTree


class ModelRunner:
    def __init__(self, server_args: ServerArgs, device="cuda"):
        args = server_args
        self.server_args = args
        self.device = torch.device(device)
        self._use_cuda_graph = not args.disable_cuda_graph  # ok: FC103
        self.kv_cache = torch.zeros(
            (args.num_layers, args.max_total_pages, 2, args.page_size, args.num_kv_heads, args.head_dim),
            dtype=torch.bfloat16,
            device=self.device,
        )
        self.refs = PageRefCounter(args.max_total_pages, self.device)
        self.tree = RadixTree(args.page_size, self.refs)
        self.attn_backend = RadixFlashInferBackend(self)
        self.model = RadixLM(args, self.attn_backend).to(self.device)
        self.gc = PageGC(self.refs, self.attn_backend)
        self.graph_runner = CudaGraphRunner(self) if self._use_cuda_graph else None

    def start(self):
        self.gc.start()
        if self.graph_runner is not None:
            self.graph_runner.capture()

    def forward(self, fb):
        if fb.forward_mode == ForwardMode.DECODE and self.graph_runner is not None and self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb.input_ids, fb.positions, fb)

    def memory_report(self):
        """Bytes held by the graph wrappers' int workspaces (page-locked planner scratch)."""
        total = 0
        for w in self.attn_backend.graph_wrappers.values():
            total += vars(w)["_int_workspace_buffer"].numel()  # expect: FC103
        return {"graph_int_workspace_bytes": total, "free_pages": self.refs.num_free()}
