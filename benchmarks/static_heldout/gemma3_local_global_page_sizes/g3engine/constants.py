"""Page sizes and sizes shared by the local and the global KV pools."""

LOCAL_PAGE_SIZE = 16  # sliding-window layers: pages that slide out of the window go back quickly
GLOBAL_PAGE_SIZE = 64  # global layers see the whole context: large pages keep page tables short
GLOBAL_WORKSPACE_BYTES = 256 * 1024 * 1024  # shared by the global decode wrappers of every bucket
PAD_SLOT = 0  # page id of page-table slots that hold no page (page 0 is never handed out)
