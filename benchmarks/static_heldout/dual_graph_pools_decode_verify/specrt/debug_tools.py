"""Operator endpoints: dumps of the pools' shared buffers and plans (admin HTTP handler, never per step)."""

from dualspec.pools.draft_pool import DraftDecodePool


def plan_report(pool: DraftDecodePool) -> dict:
    out = {"owner": pool.shared.owner, "kv_indptr": pool.shared.kv_indptr.tolist()}  # ok: FC101
    for bs, w in pool.wrappers.items():
        out[f"plan_{bs}"] = repr(vars(w).get("_plan_info"))  # expect: FC103
    return out


def admin_dump(engine) -> dict:
    return {"draft": plan_report(engine.draft_pool), "engine": engine.describe()}
