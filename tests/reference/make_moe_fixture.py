#!/usr/bin/python3
"""Builds the PyTorch reference fixtures of dynmo's mixture-of-experts model.

An independent PyTorch implementation of the MoE GPT that docs/moe.md
describes (written from that description, not from dynmo's C code): the
dense GPT of make_fixture.py, where every model.moe_every-th block (blocks
l with (l + 1) % moe_every == 0) replaces its MLP by E expert MLPs and a
linear router. It runs one forward and backward pass and ten AdamW steps
and writes what dynmo must reproduce. It must not import anything of dynmo;
the C test (tests/test_reference.c) must not need torch.

    /usr/bin/python3 tests/reference/make_moe_fixture.py [--out-dir DIR]

writes six fixtures of 4 experts (the cases below):

    fixture_moe.bin               top-2, softmax router, dropless
    fixture_moe_capacity.bin      top-2, softmax router, capacity factor 0.75,
                                  drop=probs
    fixture_moe_sigmoid.bin       top-2, sigmoid router with the selection
                                  bias and its update (bias_rate), capacity
                                  1.0, drop=position
    fixture_moe_top1.bin          top-1, softmax router, capacity factor 1.0,
                                  drop=probs: the gate is the probability
    fixture_moe_top1_sigmoid.bin  top-1, sigmoid router with the bias,
                                  dropless: the gate is the sigmoid score
    fixture_moe_slot.bin          top-2, softmax router, capacity factor 0.75,
                                  drop=slot (GShard's order)

An MoE block, for its N = B*T tokens x (the ln2 output):

    logits = x @ router_w^T                     router_w (E, C), no bias
    scores = softmax(logits) | sigmoid(logits)
    key    = scores (+ bias for the sigmoid router; bias selects only)
    choice = the k experts of highest key, best first, ties to the lower index
    gate   = k = 1: scores[choice_0] itself (Switch Transformer)
             k >= 2: gate_j = scores[choice_j] / sum_j' scores[choice_j']
             (GShard, Mixtral)
    capacity (factor > 0) = ceil(k * N * factor / E): an expert chosen by more
      pairs keeps that many: the highest scores[t, e] (ties: earlier token)
      with drop=probs, the earliest tokens with drop=position, the earliest
      in (slot j, token t) order with drop=slot (every token's first choice
      before any second choice); a dropped pair contributes nothing
    out    = res1 + sum_j [kept] gate_j * expert_{choice_j}(x)
    expert = fcproj(gelu_tanh(fc(x))), fc Linear(C, H), fcproj Linear(H, C)
    aux    = alpha * E * sum_i f_i P_i,  f_i = (pairs choosing i) / (k N),
             P_i = mean_t scores[t, i] (sigmoid: scores / their sum over i)
    z      = beta * mean_t logsumexp(logits_t)^2

The training loss is the mean cross-entropy plus aux + z of every MoE
block. After each optimizer step the sigmoid router's bias moves:
b_i += bias_rate * sign(mean_i count_i - count_i), count_i the pairs that
chose expert i in that step's forward.

Parameters in dynmo's canonical flat order: wte, wpe, per block (dense:
ln1_w ln1_b qkv_w qkv_b attproj_w attproj_b ln2_w ln2_b fc_w fc_b fcproj_w
fcproj_b; MoE: the first eight, router_w, then per expert fc_w fc_b
fcproj_w fcproj_b), lnf_w, lnf_b. Weight decay on wte, wpe and every
matrix (qkv_w, attproj_w, fc_w, fcproj_w, router_w, the experts' fc_w and
fcproj_w).

File format: the DMREF header of fixture_lib.py, version 2, whose own
fields at offset 104 are

    int32[6]      moe_every, experts, top_k, expert_hidden, router (0 softmax,
                  1 sigmoid), drop (0 probs, 1 position, 2 slot)
    float64[4]    capacity_factor, aux_loss, z_loss, bias_rate
    uint32        number of arrays, then the arrays as in version 1:

    params        float32 (P)
    tokens        int32 (B*T)
    targets       int32 (B*T)
    logits        float32 (B*T*V)  of the initial model
    loss          float32 (1)      its mean cross-entropy
    balance       float32 (1)      its aux + z summed over the MoE blocks
    grads         float32 (P)      gradient of loss + balance
    choice        int32 (M*B*T*k)  each MoE block's choices (block order)
    kept          int32 (M*B*T*k)  1 kept, 0 dropped by capacity
    lrs           float64 (steps)
    train_losses  float32 (steps)  cross-entropy before each step's update
    train_totals  float32 (steps)  cross-entropy + balance before each update
    bias          float32 (M*E)    every MoE block's bias after the 10 steps
"""

import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

# The dense model's attention is make_fixture.py's; the format, the init,
# the GPT around the blocks and the training loop are fixture_lib.py's.
from fixture_lib import (DTYPE_FLOAT32, DTYPE_INT32, GPTBase, Margins, batch_arrays, draw,
                         grad_arrays, output, output_arrays, schedule_arrays, train,
                         write_fixture)
from make_fixture import CausalSelfAttention

VERSION = 2
CONFIG = dict(vocab=64, max_seq=16, layers=2, heads=2, channels=16,
              batch=4, seq=16, steps=10, warmup=3)
MOE = dict(moe_every=2, experts=4, expert_hidden=24)
CASES = {
    "fixture_moe.bin": dict(top_k=2, router=0, drop=0, capacity_factor=0.0, aux_loss=0.01,
                            z_loss=0.001, bias_rate=0.0, seed=1234),
    "fixture_moe_capacity.bin": dict(top_k=2, router=0, drop=0, capacity_factor=0.75,
                                     aux_loss=0.01, z_loss=0.001, bias_rate=0.0, seed=1234),
    "fixture_moe_sigmoid.bin": dict(top_k=2, router=1, drop=1, capacity_factor=1.0,
                                    aux_loss=0.01, z_loss=0.001, bias_rate=0.01, seed=1234),
    "fixture_moe_top1.bin": dict(top_k=1, router=0, drop=0, capacity_factor=1.0,
                                 aux_loss=0.01, z_loss=0.001, bias_rate=0.0, seed=1234),
    "fixture_moe_top1_sigmoid.bin": dict(top_k=1, router=1, drop=0, capacity_factor=0.0,
                                         aux_loss=0.01, z_loss=0.001, bias_rate=0.01,
                                         seed=1234),
    "fixture_moe_slot.bin": dict(top_k=2, router=0, drop=2, capacity_factor=0.75,
                                 aux_loss=0.01, z_loss=0.001, bias_rate=0.0, seed=1234),
}
# Every decision (top-k, capacity) must be clear of a tie by this much, so
# that float32 rounding in dynmo cannot flip it.
DECISION_MARGIN = 1e-5


class Expert(nn.Module):
    def __init__(self, channels, hidden):
        super().__init__()
        self.fc = nn.Linear(channels, hidden)
        self.fcproj = nn.Linear(hidden, channels)

    def forward(self, x):
        return self.fcproj(F.gelu(self.fc(x), approximate="tanh"))


class MoE(nn.Module):
    def __init__(self, channels, case, margins):
        super().__init__()
        E, H = MOE["experts"], MOE["expert_hidden"]
        self.router = nn.Linear(channels, E, bias=False)
        self.experts = nn.ModuleList(Expert(channels, H) for _ in range(E))
        self.register_buffer("bias", torch.zeros(E))
        self.case = case
        self.margins = margins
        self.last_counts = None
        self.last_choice = None
        self.last_kept = None

    def forward(self, x):
        """x (N, C) -> (mixture (N, C), aux + z)."""
        N = x.shape[0]
        E, k = MOE["experts"], self.case["top_k"]
        case = self.case
        logits = x @ self.router.weight.t()
        sigmoid = case["router"] == 1
        scores = torch.sigmoid(logits) if sigmoid else logits.softmax(dim=-1)
        key = (scores + self.bias if sigmoid else scores).detach()
        # top-k, best first, ties to the lower index (a stable sort of -key)
        order = torch.sort(-key, dim=1, stable=True).indices
        choice = order[:, :k]
        ranked = key.gather(1, order)
        self.margins.see((ranked[:, k - 1] - ranked[:, k]).min())
        for j in range(k - 1):
            self.margins.see((ranked[:, j] - ranked[:, j + 1]).min())
        chosen = scores.gather(1, choice)
        if k == 1:   # Switch Transformer: the chosen score is the gate
            gates = chosen
        else:        # GShard, Mixtral: renormalised over the chosen
            gates = chosen / chosen.sum(dim=1, keepdim=True)
        counts = torch.bincount(choice.reshape(-1), minlength=E)
        kept = torch.ones(N, k, dtype=torch.bool)
        if case["capacity_factor"] > 0:
            capacity = math.ceil(k * N * case["capacity_factor"] / E)
            for e in range(E):
                pairs = [(t, j) for t in range(N) for j in range(k) if int(choice[t, j]) == e]
                if len(pairs) <= capacity:
                    continue
                if case["drop"] == 0:   # probs: highest score kept, ties to the earlier token
                    s = scores.detach()[:, e]
                    pairs.sort(key=lambda p: (-float(s[p[0]]), p[0]))
                    self.margins.see(float(s[pairs[capacity - 1][0]] - s[pairs[capacity][0]]))
                elif case["drop"] == 2:   # slot: first choices (in token order) first
                    pairs.sort(key=lambda p: (p[1], p[0]))
                for t, j in pairs[capacity:]:
                    kept[t, j] = False
        out = torch.zeros_like(x)
        for j in range(k):
            y = torch.zeros_like(x)
            for e in range(E):
                mask = (choice[:, j] == e) & kept[:, j]
                if mask.any():
                    y[mask] = self.experts[e](x[mask])
            out = out + gates[:, j:j + 1] * y
        normalised = scores / scores.sum(dim=1, keepdim=True) if sigmoid else scores
        f = counts.to(torch.float32) / (k * N)
        aux = case["aux_loss"] * E * (f * normalised.mean(dim=0)).sum()
        z = case["z_loss"] * (torch.logsumexp(logits, dim=1) ** 2).mean()
        self.last_counts = counts
        self.last_choice = choice.detach().clone()
        self.last_kept = kept.clone()
        return out, aux + z

    def update_bias(self):
        counts = self.last_counts.to(torch.float64)
        self.bias += (self.case["bias_rate"] *
                      torch.sign(counts.mean() - counts)).to(torch.float32)


class Block(nn.Module):
    def __init__(self, channels, heads, moe):
        super().__init__()
        self.ln1 = nn.LayerNorm(channels, eps=1e-5)
        self.attn = CausalSelfAttention(channels, heads)
        self.ln2 = nn.LayerNorm(channels, eps=1e-5)
        self.moe = moe
        if moe is None:
            self.fc = nn.Linear(channels, 4 * channels)
            self.fcproj = nn.Linear(4 * channels, channels)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        if self.moe is None:
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh")), 0.0
        B, T, C = x.shape
        mixed, balance = self.moe(self.ln2(x).reshape(B * T, C))
        return x + mixed.reshape(B, T, C), balance

    def canonical_tensors(self):
        shared = [self.ln1.weight, self.ln1.bias, self.attn.qkv.weight, self.attn.qkv.bias,
                  self.attn.attproj.weight, self.attn.attproj.bias,
                  self.ln2.weight, self.ln2.bias]
        if self.moe is None:
            return shared + [self.fc.weight, self.fc.bias, self.fcproj.weight, self.fcproj.bias]
        tensors = shared + [self.moe.router.weight]
        for expert in self.moe.experts:
            tensors += [expert.fc.weight, expert.fc.bias, expert.fcproj.weight,
                        expert.fcproj.bias]
        return tensors

    def matrices(self):
        m = [self.attn.qkv.weight, self.attn.attproj.weight]
        if self.moe is None:
            return m + [self.fc.weight, self.fcproj.weight]
        m.append(self.moe.router.weight)
        for expert in self.moe.experts:
            m += [expert.fc.weight, expert.fcproj.weight]
        return m


class GPT(GPTBase):
    """Every moe_every-th block an MoE block; the blocks add their balancing losses."""
    def __init__(self, case, margins):
        c = CONFIG
        super().__init__(c, lambda l: Block(
            c["channels"], c["heads"],
            MoE(c["channels"], case, margins) if (l + 1) % MOE["moe_every"] == 0 else None))

    def moe_layers(self):
        return [b.moe for b in self.blocks if b.moe is not None]


def build_fixture(case):
    margins = Margins()
    model, tensors, tokens, targets = draw(case["seed"], CONFIG, lambda: GPT(case, margins))
    arrays = batch_arrays(tensors, tokens, targets)
    logits, loss, balance = model(tokens, targets)
    (loss + balance).backward()
    moes = model.moe_layers()
    dropped = sum(int((~m.last_kept).sum()) for m in moes)
    arrays += output_arrays(logits, loss)
    arrays += [("balance", DTYPE_FLOAT32, torch.as_tensor(balance).detach().reshape(1))]
    arrays += grad_arrays(tensors)
    arrays += [("choice", DTYPE_INT32, torch.cat([m.last_choice.reshape(-1) for m in moes])),
               ("kept", DTYPE_INT32, torch.cat([m.last_kept.reshape(-1) for m in moes]))]

    def step_loss(step):
        _, loss, balance = model(tokens, targets)
        return loss, loss + balance

    def update_bias():
        for m in moes:
            if case["router"] == 1 and case["bias_rate"] > 0:
                m.update_bias()

    lrs, losses, totals = train(model, tensors, CONFIG, step_loss, update_bias)
    arrays += schedule_arrays(lrs, losses)
    arrays += [("train_totals", DTYPE_FLOAT32, torch.tensor(totals, dtype=torch.float32)),
               ("bias", DTYPE_FLOAT32, torch.cat([m.bias.reshape(-1) for m in moes]))]
    return arrays, losses, totals, margins.smallest, dropped


def fields(case):
    """Version 2's own header fields."""
    return (struct.pack("<6i", MOE["moe_every"], MOE["experts"], case["top_k"],
                        MOE["expert_hidden"], case["router"], case["drop"]) +
            struct.pack("<4d", case["capacity_factor"], case["aux_loss"], case["z_loss"],
                        case["bias_rate"]))


def main():
    out_dir = output(__doc__)
    for name, case in CASES.items():
        arrays, losses, totals, margin, dropped = build_fixture(case)
        assert margin > DECISION_MARGIN, f"{name}: a routing decision is within {margin:g} of a tie"
        path = os.path.join(out_dir, name)
        write_fixture(path, VERSION, CONFIG, fields(case), arrays)
        print(f"wrote {path} ({os.path.getsize(path)} bytes); smallest decision margin "
              f"{margin:.3g}; pairs dropped in the first forward {dropped}")
        print("  train losses: " + " ".join(f"{x:.6f}" for x in losses))
        print("  with balance: " + " ".join(f"{x:.6f}" for x in totals))


if __name__ == "__main__":
    main()
