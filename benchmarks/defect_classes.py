"""The defect classes `defect_hunt.py` runs: one generator per class, each trying inputs until its deadline.

A class records every trial (parameters, outcome), writes its record after each one (and the parameters of a trial
*before* running it, so a trial that kills the process still names its input), and on the first hit tries simpler
variants of the input that still hit (the minimized reproducer).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

KEEP_TRIALS = 40  # trials kept verbatim in the record (all are counted)


class Hunt:
    """The state and record of one class's run."""

    def __init__(self, name: str, *, deadline: float, seed: int, sink: Path) -> None:
        self.name, self.deadline, self.seed, self.sink = name, deadline, seed, sink
        self.rng = np.random.default_rng(seed)
        self.trials = 0
        self.outcomes: Counter[str] = Counter()
        self.tried: list[dict[str, Any]] = []
        self.found: dict[str, Any] | None = None
        self.in_flight: dict[str, Any] | None = None
        self.status = "running"
        self.error: str | None = None
        self.traceback: str | None = None
        self.notes: list[str] = []

    def more(self) -> bool:
        return self.found is None and time.monotonic() < self.deadline

    def begin(self, params: dict[str, Any]) -> None:
        self.in_flight = params
        self.flush()

    def record(self, params: dict[str, Any], outcome: str, hit: bool, **detail: Any) -> None:
        self.trials += 1
        self.outcomes[outcome] += 1
        self.in_flight = None
        if len(self.tried) < KEEP_TRIALS:
            self.tried.append({"params": params, "outcome": outcome, **detail})
        if hit and self.found is None:
            self.found = {"params": params, "outcome": outcome, **detail}
        self.flush()

    def minimize(
        self, check: Callable[[dict[str, Any]], bool], variants: list[Callable[[dict[str, Any]], Any]]
    ) -> None:
        """Replace the found input by simpler variants that still hit (greedy, while time is left)."""
        if self.found is None:
            return
        best = dict(self.found["params"])
        changed = True
        while changed and time.monotonic() < self.deadline:
            changed = False
            for v in variants:
                cand = v(dict(best))
                if cand is None or cand == best or time.monotonic() >= self.deadline:
                    continue
                self.begin(cand)
                if check(cand):
                    best, changed = cand, True
        self.in_flight = None
        self.found["minimized"] = best
        self.flush()

    def search(
        self,
        draw: Callable[[int], dict[str, Any]],
        trial: Callable[[dict[str, Any]], tuple[str, bool, dict[str, Any]]],
        variants: list[Callable[[dict[str, Any]], Any]],
        control: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        """Draw and run trials until the deadline or a hit (then `control` describes the hit's input under the
        control condition, and the input is minimized)."""
        i = 0
        while self.more():
            p = draw(i)
            self.begin(p)
            try:
                outcome, hit, detail = trial(p)
            except RuntimeError as exc:
                if not is_fault(exc):
                    raise
                self.record(p, "kernel fault", True, error=str(exc)[:300])
                self.notes.append("not minimized: a kernel fault leaves the CUDA context unusable")
                return
            if hit and control is not None:
                detail["control"] = control(p)
            self.record(p, outcome, hit, **detail)
            i += 1
        self.minimize(lambda q: trial(q)[1], variants)

    def flush(self) -> None:
        doc = {
            "class": self.name,
            "status": self.status,
            "found": self.found is not None,
            "trials": self.trials,
            "outcomes": dict(self.outcomes),
            "reproducer": self.found,
            "in_flight": self.in_flight,
            "tried": self.tried,
            "notes": self.notes,
            "seed": self.seed,
        }
        if self.error:
            doc["error"], doc["traceback"] = self.error, self.traceback
        self.sink.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def is_fault(exc: BaseException) -> bool:
    """A device fault surfaced as a Python exception (the CUDA context is unusable after it)."""
    text = str(exc)
    return "CUDA error" in text or "illegal memory access" in text or "unspecified launch failure" in text


# ---- shared pieces ------------------------------------------------------------------------------------------------
class Gpu:
    """torch, FlashInfer, a seeded KV cache per shape, and the fp32 reference."""

    def __init__(self) -> None:
        import flashinfer
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: the defect hunt runs on a GPU")
        self.torch, self.fi = torch, flashinfer
        self.float_ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        self._caches: dict[tuple[int, ...], tuple[Any, Any]] = {}

    def cache(self, pages: int, page: int, kh: int, d: int) -> tuple[Any, Any]:
        """A random fp16 KV cache of this shape, made once (on the device, seeded)."""
        key = (pages, page, kh, d)
        if key not in self._caches:
            t = self.torch
            gen = t.Generator(device="cuda").manual_seed(sum(key))
            shape = (pages, page, kh, d)
            k = t.randn(shape, generator=gen, device="cuda", dtype=t.float16)
            v = t.randn(shape, generator=gen, device="cuda", dtype=t.float16)
            self._caches[key] = (k, v)
        return self._caches[key]

    def layout(self, lens: list[int], page: int, qh: int, kh: int, d: int, pages: int, seed: int) -> Any:
        from flashcheck.batch import BatchSpec
        from flashcheck.layout import build_paged_layout

        spec = BatchSpec(
            tuple([1] * len(lens)),
            tuple(lens),
            page_size=page,
            num_qo_heads=qh,
            num_kv_heads=kh,
            head_dim_qk=d,
            head_dim_vo=d,
            q_dtype="float16",
            kv_dtype="float16",
            causal=False,
        )
        return build_paged_layout(spec, num_pages=pages, allocator="shuffled", seed=seed)

    def host(self, a: Any, pinned: bool = True) -> Any:
        t = self.torch.from_numpy(np.ascontiguousarray(a).astype(np.int32))
        return t.pin_memory() if pinned else t

    def dev(self, a: Any) -> Any:
        return self.host(a, pinned=False).cuda()

    def q(self, rows: int, qh: int, d: int, seed: int) -> Any:
        g = self.torch.Generator(device="cpu").manual_seed(seed)
        return self.torch.randn((rows, qh, d), generator=g).half().cuda()

    def wrong(self, out: Any, q: Any, k: Any, v: Any, layout: Any) -> float:
        """Largest |out - reference| over the real rows, inf when out holds a non-finite value."""
        from flashcheck.reference.torch_ref import paged_attention_torch

        ref = paged_attention_torch(q, k, v, layout)
        rows = layout.batch_size
        o = out[:rows].float()
        if not bool(o.isfinite().all()):
            return math.inf
        return float((o - ref[:rows]).abs().max())


TOL = 2e-2  # fp16 attention against the fp32 reference (flashcheck's FC303 tolerance is of this order)


def _pages(lens: list[int], page: int) -> int:
    return sum(-(-n // page) for n in lens)


# ---- (a) deterministic CUDA-graph decode on a re-used int workspace --------------------------------------------
def deterministic_graph_decode(h: Hunt) -> None:
    g = Gpu()
    t, fi = g.torch, g.fi
    configs = [(16, 2, 128, 1), (32, 8, 128, 16), (32, 4, 128, 16), (64, 8, 128, 1)]
    int_shared = t.zeros(8 << 20, dtype=t.uint8, device="cuda")

    def wrapper(n: int, pages: int, int_ws: Any) -> Any:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(
            g.float_ws,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            backend="fa2",  # the scheduler of the defect (fa3 plans differently)
            paged_kv_indptr_buffer=t.zeros(n + 1, dtype=t.int32, device="cuda"),
            paged_kv_indices_buffer=t.zeros(pages, dtype=t.int32, device="cuda"),
            paged_kv_last_page_len_buffer=t.zeros(n, dtype=t.int32, device="cuda"),
        )
        w.reset_workspace_buffer(g.float_ws, int_ws)
        return w

    def plan(w: Any, lay: Any, qh: int, kh: int, d: int, page: int, no_split: bool) -> None:
        w.plan(
            g.host(lay.kv_indptr),
            g.dev(lay.kv_indices[: int(lay.kv_indptr[-1])]),
            g.host(lay.kv_last_page_len),
            qh,
            kh,
            d,
            page,
            q_data_type=t.float16,
            kv_data_type=t.float16,
            disable_split_kv=no_split,
        )

    def trial(p: dict[str, Any]) -> tuple[str, bool, dict[str, Any]]:
        qh, kh, d, page = p["config"]
        k, v = g.cache((64 * 6000 + 16 * 700) // page + 64, page, kh, d)  # fixed per shape: made once
        pages = k.shape[0]
        sentinel = p["variant"] == "sentinel"
        int_ws = t.full((8 << 20,), 0xA5, dtype=t.uint8, device="cuda") if sentinel else int_shared
        n = len(p["small"])
        ws = wrapper(n, pages, int_ws)
        if p["variant"] == "shared":  # a larger split-KV plan of another wrapper ran on this int workspace first
            big = g.layout(p["big"], page, qh, kh, d, pages, p["seed"])
            wb = wrapper(len(p["big"]), pages, int_ws)
            plan(wb, big, qh, kh, d, page, no_split=False)
            wb.run(g.q(len(p["big"]), qh, d, p["seed"]), (k, v))
        elif p["variant"] == "replanned":  # this wrapper ran a split-KV plan of long requests first
            long = g.layout(p["big"][:n], page, qh, kh, d, pages, p["seed"])
            plan(ws, long, qh, kh, d, page, no_split=False)
            ws.run(g.q(n, qh, d, p["seed"]), (k, v))
        small = g.layout(p["small"], page, qh, kh, d, pages, p["seed"] + 1)
        plan(ws, small, qh, kh, d, page, no_split=True)
        info = [int(x) for x in (ws._plan_info.tolist() if hasattr(ws._plan_info, "tolist") else ws._plan_info)]
        q = g.q(n, qh, d, p["seed"] + 2)
        guard = t.full((n + 64, qh, d), float("nan"), dtype=t.float16, device="cuda")
        out = guard[:n]
        ws.run(q, (k, v), out=out)
        first = out.clone()
        ws.run(q, (k, v), out=out)
        graph = t.cuda.CUDAGraph()
        stream = t.cuda.Stream()
        stream.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(stream):
            ws.run(q, (k, v), out=out)
        t.cuda.current_stream().wait_stream(stream)
        with t.cuda.graph(graph, stream=stream):
            ws.run(q, (k, v), out=out)
        out.zero_()
        graph.replay()
        t.cuda.synchronize()
        err = g.wrong(out, q, k, v, small)
        err_eager = g.wrong(first, q, k, v, small)
        bitwise = bool(t.equal(first, out))
        guard_hit = bool(guard[n:].isnan().logical_not().any())
        detail = {"grid_x": info[0] if info else None, "batch": n, "max_err": err, "max_err_eager": err_eager}
        detail |= {"bitwise_equal_eager_vs_replay": bitwise, "rows_past_batch_written": guard_hit}
        hit = err > TOL or err_eager > TOL or guard_hit or not bitwise
        outcome = "wrong output" if (err > TOL or err_eager > TOL) else "ok"
        outcome = "rows past the batch written" if guard_hit else outcome
        outcome = "not bitwise reproducible" if outcome == "ok" and not bitwise else outcome
        return outcome, hit, detail

    start = time.monotonic()

    def draw(i: int) -> dict[str, Any]:
        # an int workspace full of garbage (what torch.empty may hand out) may fault: only in the last third
        late = time.monotonic() - start > (h.deadline - start) * 2 / 3
        cfg = configs[i % len(configs)]
        page = cfg[3]
        return {
            "variant": "sentinel" if late and i % 3 == 2 else ("shared", "replanned")[i % 2],
            "config": list(cfg),
            "big": [int(x) for x in h.rng.integers(1000 * page // 16 + 200, 6000, size=int(h.rng.integers(16, 65)))],
            "small": [int(x) for x in h.rng.integers(1, 700, size=int(h.rng.choice([1, 2, 3, 4, 8, 16])))],
            "seed": int(h.rng.integers(1 << 30)),
        }

    h.search(
        draw,
        trial,
        [
            lambda p: {**p, "small": p["small"][:1]},
            lambda p: {**p, "small": [min(p["small"])]},
            lambda p: {**p, "big": p["big"][: max(1, len(p["big"]) // 2)]},
        ],
    )


# ---- (b) MLA with KV lengths past 16384 -------------------------------------------------------------------------
LONG_KV = [16383, 16384, 16385, 16400, 20000, 24576, 32767, 32768, 32769, 40000]


def _session_steps(h: Hunt, target_name: str, config: dict[str, Any], make_steps: Callable[[Any], list[Any]]) -> None:
    """Run generated steps through flashcheck's driver (every property, layers off); a hit is any finding that is
    not a documented upstream behaviour."""
    from flashcheck.errors import InvalidArgument
    from flashcheck.known import split_known
    from flashcheck.repro import make_repro
    from flashcheck.scenario import Scenario
    from flashcheck.session import open_session
    from flashcheck.targets.registry import make_target

    target = make_target(target_name, **config)
    ran: list[Any] = []  # the steps this session executed: a hit's reproducer is all of them (state carries over)
    with open_session(target, layers="off", seed=h.seed) as drv:
        while h.more():
            for s in make_steps(target.capacity):
                if not h.more():
                    break
                p = {"target": target_name, "config": config, "step": s.to_dict(), "index": len(ran)}
                h.begin(p)
                ran.append(s)
                try:
                    r = drv.execute(s, len(ran) - 1)
                except InvalidArgument as exc:  # the generator made a step outside the target's capacity
                    ran.pop()
                    h.record(p, "outside capacity", False, reason=str(exc)[:200])
                    continue
                if r.rejected:
                    h.record(p, "rejected", False, reason=r.rejected)
                    continue
                unexpected, known = split_known(r.findings, target.name)
                hit = bool(unexpected)
                ids = sorted({f.id for f in unexpected})
                detail: dict[str, Any] = {
                    "messages": [f.message[:300] for f in unexpected[:3]],
                    "known": sorted({f.id for f in known}),
                }
                if hit:  # a flashcheck reproducer: `flashcheck replay FILE` re-runs the session up to this step
                    scen = Scenario(target_name, tuple(ran), h.seed, config)
                    detail["flashcheck_repro"] = make_repro(scen, len(ran) - 1, unexpected[0], layers="off")
                h.record(p, "finding " + ",".join(ids) if hit else "ok", hit, **detail)
                if hit or drv.poisoned:
                    return


def mla_long_kv(h: Hunt) -> None:
    from flashcheck.scenario import Step

    def steps(cap: Any) -> list[Any]:
        n = int(h.rng.integers(1, 4))
        lens = [int(h.rng.choice(LONG_KV)) for _ in range(n)]
        while sum(lens) + 2 > cap.max_pages:
            lens.pop()
        op = str(h.rng.choice(["eager", "replay"]))
        return [Step(op, tuple([1] * len(lens)), tuple(lens), seed=int(h.rng.integers(1 << 30)))]

    _session_steps(h, "mla-fa2", {"max_kv_len": 40960, "max_pages": 98304, "buckets": [1, 2, 4]}, steps)


# ---- (c) decode given a non-monotone kv_indptr ------------------------------------------------------------------
def non_monotone_kv_indptr(h: Hunt) -> None:
    from flashcheck.session import open_session
    from flashcheck.targets.registry import make_target

    for name in ("decode-cuda", "decode-tc"):
        target = make_target(name, buckets=(8,))
        with open_session(target, layers="off", seed=h.seed) as drv:
            import torch as t

            while h.more() and h.trials < 10_000:
                n = int(h.rng.integers(2, 9))
                lens = [int(x) for x in h.rng.integers(17, 400, size=n)]
                spec = target.capacity.template.with_lengths(tuple([1] * n), tuple(lens))
                from flashcheck.layout import build_paged_layout

                good = build_paged_layout(spec, num_pages=target.capacity.max_pages, seed=h.trials)
                bad_indptr = good.kv_indptr.copy()
                j = int(h.rng.integers(1, n))
                bad_indptr[j] = min(int(bad_indptr[j + 1]) + int(h.rng.integers(1, 4)), int(bad_indptr[-1]))
                if bad_indptr[j] <= bad_indptr[j + 1]:
                    continue
                bad = dataclasses.replace(good, kv_indptr=bad_indptr)
                p = {"target": name, "kv_lens": lens, "kv_indptr": [int(x) for x in bad_indptr]}
                h.begin(p)
                q = drv.queries(spec, h.trials)
                try:
                    target.plan(bad)
                    out = target.run(q).float()
                    t.cuda.synchronize()
                except (ValueError, RuntimeError) as exc:
                    if is_fault(exc):
                        h.record(p, "kernel fault", True, error=str(exc)[:300])
                        return
                    h.record(p, "rejected", False, error=str(exc)[:200])
                    continue
                target.plan(good)
                ref = target.run(q).float()
                t.cuda.synchronize()
                differs = [int(r) for r in range(n) if not t.allclose(out[r], ref[r], atol=5e-2)]
                h.record(p, "accepted silently", True, rows_differing=differs)
            if h.found is not None:
                break
    if h.found is not None:
        h.notes.append("FlashInfer's decode plan() does not validate kv_indptr; flashcheck's FC301 flags it")


# ---- (d) boundary page counts -----------------------------------------------------------------------------------
def boundary_page_counts(h: Hunt) -> None:
    from flashcheck.scenario import Step

    def steps(cap: Any) -> list[Any]:
        page = cap.template.page_size
        sizes = sorted({1, *cap.buckets, *(b + 1 for b in cap.buckets if b + 1 <= cap.max_batch_size)})
        n = int(h.rng.choice(sizes))
        top = max(1, cap.max_kv_len // page)
        lens = []
        for _ in range(n):
            m = int(h.rng.choice([1, 2, top // 2, top - 1, top]))
            lens.append(max(1, min(cap.max_kv_len, m * page + int(h.rng.choice([-1, 0, 1])))))
        while _pages(lens, page) + 2 > cap.max_pages and len(lens) > 1:
            lens.pop()
        qo = [1] * len(lens)
        if cap.max_qo_len > 1:
            qo = [int(min(x, cap.max_qo_len, int(h.rng.choice([1, cap.max_qo_len])))) for x in lens]
        op = str(h.rng.choice(["eager", "replay"])) if cap.buckets else "eager"
        return [Step(op, tuple(qo), tuple(lens), seed=int(h.rng.integers(1 << 30)))]

    names = ["decode-tc", "decode-cuda", "prefill-fa2", "mla-fa2"]
    start = time.monotonic()
    share = (h.deadline - start) / len(names)
    deadline = h.deadline
    for k, name in enumerate(names):
        h.deadline = min(deadline, start + share * (k + 1))
        _session_steps(h, name, {}, steps)
        if h.found is not None:
            break
    h.deadline = deadline


# ---- (e) the pinned int workspace re-planned while its copy is in flight ----------------------------------------
def int_workspace_replanned_in_flight(h: Hunt) -> None:
    from flashcheck.pressure import hold_stream

    g = Gpu()
    t, fi = g.torch, g.fi
    qh, kh, d, page = 32, 8, 128, 16

    def trial(p: dict[str, Any]) -> tuple[str, bool, dict[str, Any]]:
        k, v = g.cache(32 * (300 + 4000) // page + 64, page, kh, d)
        pages = k.shape[0]
        la = g.layout(p["a"], page, qh, kh, d, pages, p["seed"])
        lb = g.layout(p["b"], page, qh, kh, d, pages, p["seed"] + 1)
        w = fi.BatchDecodeWithPagedKVCacheWrapper(g.float_ws, "NHD", use_tensor_cores=p["tensor_cores"])
        args = []
        for lay in (la, lb):  # every input on its own buffers: only FlashInfer's pinned workspace is shared
            args.append((g.host(lay.kv_indptr), g.dev(lay.kv_indices), g.host(lay.kv_last_page_len)))
        qa, qb = g.q(len(p["a"]), qh, d, p["seed"]), g.q(len(p["b"]), qh, d, p["seed"] + 1)
        kw = {"q_data_type": t.float16, "kv_data_type": t.float16}
        t.cuda.synchronize()
        if p["hold_us"]:
            hold_stream(p["hold_us"], t)
        w.plan(*args[0], qh, kh, d, page, **kw)
        out_a = w.run(qa, (k, v))
        w.plan(*args[1], qh, kh, d, page, **kw)
        out_b = w.run(qb, (k, v))
        t.cuda.synchronize()
        err_a, err_b = g.wrong(out_a, qa, k, v, la), g.wrong(out_b, qb, k, v, lb)
        hit = err_a > TOL
        return ("plan A ran with plan B's schedule" if hit else "ok"), hit, {"max_err_a": err_a, "max_err_b": err_b}

    def draw(i: int) -> dict[str, Any]:
        n = int(h.rng.integers(1, 33))
        return {
            "tensor_cores": bool(i % 2 == 0),
            "hold_us": 5000.0,
            "a": [int(x) for x in h.rng.integers(1, 300, size=n)],
            "b": [int(x) for x in h.rng.integers(1500, 4000, size=n)],
            "seed": int(h.rng.integers(1 << 30)),
        }

    h.search(
        draw,
        trial,
        [
            lambda p: {**p, "a": p["a"][:1], "b": p["b"][:1]},
            lambda p: {**p, "a": p["a"][: max(1, len(p["a"]) // 2)], "b": p["b"][: max(1, len(p["b"]) // 2)]},
        ],
        control=lambda p: "without the hold: " + trial({**p, "hold_us": 0.0})[0],
    )


CLASSES: dict[str, tuple[Callable[[Hunt], None], str]] = {
    "deterministic-graph-decode": (
        deterministic_graph_decode,
        "tensor-core decode (fa2), CUDA-graph mode, disable_split_kv=True, batch 1-16, after a larger split-KV "
        "plan on the same int workspace (or on one full of garbage); eager and graph replay vs the fp32 reference, "
        "NaN guard rows past the batch, eager vs replay bitwise",
    ),
    "int-workspace-replanned-in-flight": (
        int_workspace_replanned_in_flight,
        "eager decode (tensor-core and CUDA-core): stream held 5 ms, plan A, run A, plan B, run B; run A vs its "
        "reference (an idle-stream control on a hit)",
    ),
    "non-monotone-kv-indptr": (
        non_monotone_kv_indptr,
        "decode-cuda and decode-tc planned with a kv_indptr with one decreasing entry (values within the pool)",
    ),
    "mla-long-kv": (mla_long_kv, f"MLA fa2 eager and graph steps, KV lengths from {LONG_KV}, batch 1-3"),
    "boundary-page-counts": (
        boundary_page_counts,
        "decode-tc, decode-cuda, prefill-fa2, mla-fa2: KV lengths at 1, 2, max/2, max-1, max pages +-1 token, "
        "batch sizes at bucket edges, eager and replay, every flashcheck property",
    ),
}
