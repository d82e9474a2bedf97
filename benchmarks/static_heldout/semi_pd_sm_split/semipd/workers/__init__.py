from semipd.workers.decode_worker import DecodeWorker
from semipd.workers.prefill_worker import PrefillWorker

__all__ = ["DecodeWorker", "PrefillWorker"]
