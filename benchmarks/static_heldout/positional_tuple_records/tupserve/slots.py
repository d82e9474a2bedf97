"""Slot numbers of the positional records the engine passes around.

Per-step metadata travel as one flat tuple (``records.make_meta``) instead of a
dataclass: the scheduler pickles it to the worker, the worker indexes it with the
constants below, and nothing on the step path pays for attribute lookups or a
``__post_init__``. Slots that the FlashInfer planner reads on the host hold a
``(device, host)`` pair whose host side is pinned.
"""

# (device, host) pairs
DEV = 0
HOST = 1

# step record: 9 slots
QO_INDPTR = 0  # pair, [bs + 1] query offsets
KV_INDPTR = 1  # pair, [bs + 1] page offsets
KV_INDICES = 2  # device, flat page ids
KV_LAST_PAGE_LEN = 3  # pair, [bs]
SEQ_LENS = 4  # pair, [bs] tokens in the cache once this step is written
POSITIONS = 5  # device, [num_tokens]
BATCH_SIZE = 6  # int
NUM_TOKENS = 7  # int
MODE = 8  # "decode" | "extend"
META_LEN = 9

# scheduler rows: one tuple per scheduled request
ROW_RID = 0
ROW_SEQ_LEN = 1
ROW_EXTEND = 2
ROW_PAGES = 3
ROW_TOKENS = 4

# sampling parameters: one tuple per scheduled request
P_TEMPERATURE = 0
P_TOP_P = 1
P_TOP_K = 2
P_MIN_NEW = 3
P_GENERATED = 4

# request records kept by the scheduler (lists: updated in place)
REQ_PROMPT = 0
REQ_OUTPUT = 1
REQ_PAGES = 2
REQ_PARAMS = 3

# per-bucket graph state: one list per captured batch size
BUF_INDPTR = 0
BUF_INDICES = 1
BUF_LAST_PAGE = 2
BUF_WRAPPER = 3
BUF_GRAPH = 4
BUF_INPUT_IDS = 5
BUF_POSITIONS = 6
BUF_OUTPUT = 7
BUF_LEN = 8

assert META_LEN == MODE + 1 and BUF_LEN == BUF_OUTPUT + 1  # ok: FC109
