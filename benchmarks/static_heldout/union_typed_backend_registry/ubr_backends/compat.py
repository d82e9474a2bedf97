"""Names the engine uses to talk about FlashInfer internals, kept in one place."""

PLAN_INFO_ATTR = "_plan_info"
KV_LAYOUTS = ("NHD", "HND")


def normalise_layout(layout: str) -> str:
    layout = layout.upper()
    if layout not in KV_LAYOUTS:
        raise ValueError(f"kv layout {layout!r} is not one of {KV_LAYOUTS}")
    return layout
