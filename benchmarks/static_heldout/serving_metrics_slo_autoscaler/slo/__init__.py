"""SLO tracking for the decode engine: metrics, CUDA-event step timing, bucket autoscaling."""

from .autoscaler import BucketAutoscaler, BucketPool
from .config import SLOConfig
from .metrics import Counter, Gauge, Histogram, MetricsRegistry
from .timing import StepTimer

__all__ = ["BucketAutoscaler", "BucketPool", "Counter", "Gauge", "Histogram", "MetricsRegistry", "SLOConfig",
           "StepTimer"]
