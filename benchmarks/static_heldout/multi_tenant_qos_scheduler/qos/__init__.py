from qos.tenants import TenantLedger, TenantPolicy
from qos.requests import Request, RequestState
from qos.preempt import PreemptionManager
from qos.scheduler import QoSScheduler, StepPlan

__all__ = ["TenantLedger", "TenantPolicy", "Request", "RequestState", "PreemptionManager", "QoSScheduler", "StepPlan"]
