import torch


def route_topk(router_logits, top_k):
    probs = torch.softmax(router_logits.float(), dim=-1)
    topk_w, topk_ids = probs.topk(top_k, dim=-1)
    topk_w = topk_w / topk_w.sum(dim=-1, keepdim=True)
    return topk_w.to(router_logits.dtype), topk_ids.to(torch.int32)
