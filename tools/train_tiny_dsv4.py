#!/usr/bin/env python3
"""Train the tiny DeepSeek-V4 model (fixtures/tiny-dsv4) in float32 with PyTorch.

Samples are BOS + documents of tools/tiny_dsv4_data.py (counting, alphabet, additions) joined by
newlines and cut to T+1 tokens.  Loss: next-token cross entropy of the main head + 0.3 x the MTP
head's cross entropy (token t+2).  The routing bias of the score-routed layers is updated as in
DeepSeek's auxiliary-loss-free balancing (bias += rate * sign(mean load - load)); hash layers route
by token id.  With --qat-frac F the last fraction F of the steps sees straight-through fake
quantized weights (FP8 128x128, FP4 1x32, bf16), so the exported checkpoint loses little.

usage: train_tiny_dsv4.py --docs train_docs.json --out weights.pt [--device cpu|cuda]
       [--steps N] [--time-limit SECONDS] [--batch B] [--seq T] [--lr LR] [--seed S] [--qat-frac F]
Training stops at --steps or at --time-limit, whichever comes first; the log has loss per 50 steps.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_dsv4_model import TinyDSV4, tiny_config  # noqa: E402


def batches(docs, B, T, rng, bos, nl_id):
    while True:
        rows = []
        for _ in range(B):
            seq = [bos]
            while len(seq) < T + 1:
                seq += rng.choice(docs) + [nl_id]
            rows.append(seq[:T + 1])
        yield torch.tensor(rows, dtype=torch.long)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--time-limit", type=float, default=540.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--qat-frac", type=float, default=0.2)
    ap.add_argument("--nl-id", type=int, default=-1, help="id of the newline token (default: looked up)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    with open(a.docs) as f:
        docs = json.load(f)
    nl = a.nl_id
    if nl < 0:
        tj = os.path.join(os.path.dirname(a.docs), "tokenizer.json")
        with open(tj) as f:
            nl = json.load(f)["model"]["vocab"]["\u010a"]  # byte 0x0a in GPT-2's byte alphabet
    c = tiny_config()
    model = TinyDSV4(c, seed=a.seed).to(a.device)
    nparam = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = batches(docs, a.batch, a.seq, rng, c["bos"], nl)
    t0 = time.time()
    print("params %d, device %s, batch %d x %d, seed %d" % (nparam, a.device, a.batch, a.seq, a.seed), flush=True)
    step, ema = 0, None
    warm = 100
    history = []
    while step < a.steps and time.time() - t0 < a.time_limit:
        frac = max(step / a.steps, (time.time() - t0) / a.time_limit)
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        model.qat = frac >= 1.0 - a.qat_frac
        x = next(gen).to(a.device)
        logits, mtp = model(x[:, :-1])
        loss_main = F.cross_entropy(logits.reshape(-1, c["vocab"]), x[:, 1:].reshape(-1))
        loss_mtp = F.cross_entropy(mtp.reshape(-1, c["vocab"]), x[:, 2:].reshape(-1))
        loss = loss_main + 0.3 * loss_mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing of the score-routed layers
            for p, load in model._aux_load.items():
                key = model._key(p + ".gate.bias")
                if key in model.p:
                    b = model.p[key]
                    b += 1e-3 * torch.sign(load.mean() - load)
        lm = loss_main.item()
        ema = lm if ema is None else 0.95 * ema + 0.05 * lm
        if step % 50 == 0:
            print("step %5d  t %6.1fs  lr %.2e  loss %.4f (ema %.4f)  mtp %.4f  qat %d" % (
                step, time.time() - t0, lr, lm, ema, loss_mtp.item(), int(model.qat)), flush=True)
            history.append((step, round(time.time() - t0, 1), round(lm, 4), round(loss_mtp.item(), 4)))
        step += 1
    dt = time.time() - t0
    print("done: %d steps in %.1f s, final loss ema %.4f" % (step, dt, ema), flush=True)
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    torch.save({"state": state, "config": c, "steps": step, "seconds": dt, "loss_ema": ema, "seed": a.seed,
                "device": a.device, "history": history, "args": vars(a)}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
