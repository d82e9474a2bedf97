"""mpserve: a driver process and spawned GPU worker processes.

The driver schedules and keeps the sampling bookkeeping; each worker owns one
GPU, an attention backend plugin and a CUDA-graph runner. Per-step metadata
travels through a shared-memory host mirror (see ``mpserve.shm``); commands and
sampled tokens travel through a ``multiprocessing`` pipe.
"""

__version__ = "0.3.0"
