from .page_pool import DecodeBatch, KVQuantConfig, QuantPagePool
from .requant import RequantScheduler
from .decode import QuantDecodeBackend
