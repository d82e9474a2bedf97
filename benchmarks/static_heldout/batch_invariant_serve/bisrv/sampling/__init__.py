from bisrv.sampling.seeded import SeededSampler

__all__ = ["SeededSampler"]
