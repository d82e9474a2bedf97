"""Offline: run the repeated-needle probe and write the per-head echo scores the router loads."""

import argparse
from typing import List

import torch

from razor import calibrate_head_scores


def collect_echo_probs(model, probe_ids: torch.Tensor) -> List[torch.Tensor]:
    out = model(probe_ids, output_attentions=True)
    return [a[0] for a in out.attentions]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--per-layer", type=int, default=1)
    ap.add_argument("--out", default="razor_scores.pt")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).cuda().eval()
    needle = torch.randint(100, 30000, (1, 512), device="cuda")
    with torch.no_grad():
        probs = collect_echo_probs(model, torch.cat([needle, needle], dim=1))
    scores = calibrate_head_scores(probs, args.per_layer)
    torch.save({"scores": scores.scores, "retrieval": scores.retrieval}, args.out)


if __name__ == "__main__":
    main()
