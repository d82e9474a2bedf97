# Helpers for one device call: lanes of commands that all end before a shared deadline, logs kept under $W and
# packed into $OUT at the end (the device returns at most 8 files). Source it after `install.sh`.
#   BUDGET_S  seconds this call may spend before packing (default 540)
W=${W:-/tmp/fc}
mkdir -p "$W"
DEADLINE=${DEADLINE:-$(( $(date +%s) + ${BUDGET_S:-540} ))}  # kept when a script sources another
left() { echo $(( DEADLINE - $(date +%s) )); }
# step LOG CMD...: run CMD with what is left of the budget, append its output and exit status to $W/LOG
step() {
  local log=$W/$1; shift
  local t; t=$(left)
  if [ "$t" -le 10 ]; then echo "== SKIPPED (no time left): $*" >>"$log"; return 0; fi
  local s; s=$(date +%s)
  echo "== $(date -u +%H:%M:%S) $* (limit ${t}s)" >>"$log"
  timeout -k 5 "$t" "$@" >>"$log" 2>&1
  echo "== rc=$? after $(( $(date +%s) - s ))s" >>"$log"
}
# pack: compiled kernels and every log back to this machine
pack() {
  find "${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer" -path '*cached_ops*' -name '*.so' 2>/dev/null \
    | tar czf "$OUT/jit.tgz" -T - 2>/dev/null
  tar czf "$OUT/logs.tgz" -C "$W" .
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
  ls -la "$OUT"
}
# fz NAME TARGET BUDGET: the built-in fuzz suite narrowed to one target, reproducers under $W/fuzz-NAME
fz() {
  step "fuzz-$1.log" python3 -m pytest -p flashcheck.pytest_plugin -m fuzz --pyargs flashcheck.fuzz.suite \
    --flashcheck-target "$2" --flashcheck-budget "$3" --flashcheck-out "$W/fuzz-$1" -q -rs -p no:cacheprovider
}
SEED_CLASSES="TolistInPrepareReplay DeviceIndptrToPlan IndptrPollutedInGraph UndersizedPrefillWorkspace ReallocOnReplay
  SplitKVOversubscribed"
