from .ngram_cache import NgramCache
from .ngram_worker import NGRAMWorker

__all__ = ["NGRAMWorker", "NgramCache"]
