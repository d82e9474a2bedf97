import asyncio
import logging

from sgl_lite.model_executor.forward_batch_info import ForwardBatch
from sgl_lite.model_executor.model_runner import CudaGraphRunner, ModelRunner

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, model_runner: ModelRunner, graph_runner: CudaGraphRunner):
        self.model_runner = model_runner
        self.graph_runner = graph_runner
        self.waiting = asyncio.Queue()

    async def event_loop(self):
        while True:
            sched_batch = await self.waiting.get()
            batch = ForwardBatch.init_new(sched_batch, self.model_runner.device)
            out = await asyncio.to_thread(self.run_batch, batch)
            lens = batch.seq_lens.cpu()  # ok: FC101
            logger.info("finished batch of %d, max len %d", batch.batch_size, int(lens.max()))
            sched_batch.finish(out)

    def run_batch(self, batch: ForwardBatch):
        if batch.batch_size in self.graph_runner.graphs:
            return self.graph_runner.replay(batch.batch_size, batch)
        return self.model_runner.forward_decode(batch.q, batch.kv_cache, batch)
