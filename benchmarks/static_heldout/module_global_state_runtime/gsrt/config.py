"""Runtime configuration as module constants; apply_args() overrides some of them at start-up."""
import os

# model shape (a small Llama-like decoder with sliding-window and long-context "global" layers)
NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
FFN = 11008
VOCAB = 32000
EOS_ID = 2
ROPE_THETA = 10000.0
LAYER_KINDS = ("full", "swa", "full", "global", "full", "swa", "full", "global")
SWA_WINDOW = 4096

# limits (overridden from the command line)
MAX_BS = 128
MAX_MODEL_LEN = 32768
MAX_NUM_TOKENS = 8192
CHUNK_SIZE = 2048
PAGE_SIZE = 16
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)

# workspace sizes
CHUNK_WS_BYTES = 128 * 1024 * 1024          # raised by apply_args() from the chunk size
CASCADE_WS_BYTES = 64 << 20                 # set by engine.setup() from --cascade-ws-mb
GRAPH_WORKSPACE_BYTES = 64 * 1024 * 1024    # shared by every captured decode graph
PREFILL_WS_MB = int(os.environ.get("GSRT_PREFILL_WS_MB", "256"))

# features
SHARED_PREFIX_LEN = 0                       # tokens of a system prompt shared by every request
LONG_DECODE_DIRECT = os.environ.get("GSRT_LONG_DIRECT", "0") == "1"
KV_FP8 = os.environ.get("GSRT_KV_FP8", "0") == "1"
SCRUB_FREED_PAGES = True
NULL_PAGE = 0
DEFRAG_EVERY = 4096


def apply_args(args):
    """Copy command-line limits into the module (called once, before anything is allocated)."""
    global MAX_BS, MAX_MODEL_LEN, MAX_NUM_TOKENS, CHUNK_SIZE, CHUNK_WS_BYTES
    global SHARED_PREFIX_LEN, GRAPH_BATCH_SIZES, DEFRAG_EVERY
    MAX_BS = args.max_batch_size
    MAX_MODEL_LEN = args.max_model_len
    MAX_NUM_TOKENS = args.max_num_tokens
    CHUNK_SIZE = args.chunk_size
    SHARED_PREFIX_LEN = args.shared_prefix_len
    DEFRAG_EVERY = args.defrag_every
    GRAPH_BATCH_SIZES = tuple(b for b in GRAPH_BATCH_SIZES if b <= MAX_BS)
    # split-k partials of one chunk: heads x chunk tokens x (head_dim + lse) floats, 4 splits
    CHUNK_WS_BYTES = max(CHUNK_WS_BYTES, NUM_Q_HEADS * CHUNK_SIZE * (HEAD_DIM + 1) * 4 * 4)
