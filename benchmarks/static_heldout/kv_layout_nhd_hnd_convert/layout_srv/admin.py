"""Admin endpoints: pool and layout reports for operators."""

from layout_srv.server import LayoutServer


def layout_report(server: LayoutServer) -> dict:
    report = {}
    for layout, pool in server.pools.items():
        report[layout.value] = {
            "kv_layout": getattr(pool, "_kv_layout"),  # ok: FC103
            "used": pool.used,
            "free": pool.num_pages - pool.used,
        }
    report["hnd_row_hits"] = server.backend.hnd_row_hits.tolist()  # ok: FC101
    report["migrating"] = len(server.migrator.pending)
    return report
