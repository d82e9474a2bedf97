"""FC305 output-contract: `run` and `replay` return exactly the real rows, on the device, in the template dtype."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from flashcheck.check import Check
from flashcheck.findings import Finding, Location
from flashcheck.properties.phases import OnOutput, Phase, Property

__all__ = ["OUTPUT_CONTRACT", "check_output_contract"]

OUTPUT_CONTRACT = Check(
    "FC305",
    "output-contract",
    "property",
    doc="""\
    The attention output handed back to the model is exactly ``[real rows, heads, head_dim_vo]`` on the device.

    What it checks
        After every eager ``run`` and every graph ``replay``, the returned object is a tensor of shape
        ``[total query rows of the real batch, num_qo_heads, head_dim_vo]``, in the template's query dtype, on the
        device the KV cache lives on. Padded rows of the bucket must be sliced off; nothing else is compared
        (FC303) when the contract fails.

    Why it breaks serving
        The layer after attention reshapes the output by the real token count. One padded row too many shifts
        every later token of the batch into the wrong request (or fails a reshape and kills the step); a float32
        output where the model expects bf16 doubles the activation memory and breaks fused kernels that follow; an
        output on the host is a device-to-host copy every step.

    Example
        A graph runner returns the bucket's static output sliced by the wrong count::

            return self.static_out[: real_rows + 1]       # FC305: one padded row too many

    Use instead
        Slice the static output with the real row count recorded when the batch was prepared
        (``static_out[:num_tokens]``), and allocate it in the model's dtype on the model's device.

    Known false positives
        A target whose kernel returns the log-sum-exp with the output must return the output alone; a target that
        deliberately returns another layout (HND) must transpose it first.
    """,
)


def check_output_contract(
    shape: Sequence[int] | None,
    dtype: str | None,
    device: str | None,
    *,
    rows: int,
    heads: int,
    head_dim: int,
    want_dtype: str,
    want_device: str,
    what: str,
    location: Location | None = None,
) -> list[Finding]:
    """One FC305 finding listing every way the output (`shape`, `dtype`, `device`; None: not a tensor) breaks
    the contract, or none."""
    want_shape = (rows, heads, head_dim)
    problems: list[str] = []
    if shape is None:
        problems.append("is not a tensor")
    else:
        got = tuple(int(x) for x in shape)
        if got != want_shape:
            extra = ""
            if len(got) == 3 and got[1:] == want_shape[1:]:
                extra = f" ({got[0] - rows:+d} rows)"
            problems.append(f"has shape {list(got)}, expected {list(want_shape)}{extra}")
        if dtype is not None and dtype.removeprefix("torch.") != want_dtype:
            problems.append(f"has dtype {dtype.removeprefix('torch.')}, expected {want_dtype}")
        if device is not None and device.split(":")[0] != want_device.split(":", maxsplit=1)[0]:
            problems.append(f"is on {device}, expected {want_device}")
    if not problems:
        return []
    return [
        OUTPUT_CONTRACT.finding(
            f"{what} output " + "; ".join(problems),
            hint="return exactly the real rows [total_qo, num_qo_heads, head_dim_vo] in the query dtype on the device",
            location=location,
            evidence={
                "check": "output",
                "what": what,
                "shape": list(shape) if shape is not None else None,
                "expected_shape": list(want_shape),
                "dtype": dtype,
                "device": device,
            },
        )
    ]


def _on_output(obs: OnOutput) -> list[Finding]:
    out, spec = obs.out, obs.layout.spec
    shape = tuple(out.shape) if hasattr(out, "shape") and hasattr(out, "dtype") else None
    return check_output_contract(
        shape,
        str(out.dtype) if shape is not None else None,
        str(getattr(out, "device", obs.device)) if shape is not None else None,
        rows=obs.layout.real_qo_rows(),
        heads=spec.num_qo_heads,
        head_dim=spec.head_dim_vo,
        want_dtype=spec.q_dtype,
        want_device=obs.device,
        what=obs.what,
        location=dataclasses.replace(obs.location, region="run" if obs.what == "eager" else "replay"),
    )


# an output that breaks the contract is not compared (FC303): it is not this batch's attention output
ON_OUTPUT = Property(OUTPUT_CONTRACT, Phase.ON_OUTPUT, _on_output, blocks=True)
