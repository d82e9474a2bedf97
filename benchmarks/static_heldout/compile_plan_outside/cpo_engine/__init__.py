"""torch.compile engine with FlashInfer planned outside the compiled region."""
from cpo_engine.config import EngineConfig, KVCacheSpec
from cpo_engine.engine import CompiledEngine, SchedulerOutput

__all__ = ["CompiledEngine", "EngineConfig", "KVCacheSpec", "SchedulerOutput"]
