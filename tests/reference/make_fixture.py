#!/usr/bin/python3
"""Builds the PyTorch reference fixture that tests/test_reference.c checks dynmo against.

This script is an independent implementation of dynmo's GPT-2 model in PyTorch
(written from include/dynmo/model.h, not from dynmo's C code). It runs one
forward and backward pass and ten AdamW steps on a tiny model and writes
everything dynmo must reproduce to tests/reference/fixture_tiny.bin. It must
not import anything of dynmo; the C test must not need torch.

Run it with Debian's torch (python3-torch 1.13), from anywhere:

    /usr/bin/python3 tests/reference/make_fixture.py [--out PATH]

The model: token and learned position embeddings; pre-LN blocks
x += attproj(attention(ln1(x))); x += fcproj(gelu_tanh(fc(ln2(x)))), with
causal multi-head attention whose qkv Linear(C, 3C) output is laid out
[q | k | v] and whose heads split C, scale 1/sqrt(C/NH); biases everywhere;
LayerNorm eps 1e-5; a final LayerNorm; an LM head tied to wte; mean
cross-entropy over the B*T tokens; all fp32.

Initial weights come from torch's own generator (seed 1234): nn.Linear's
default init (uniform, biases included, so biases are nonzero), embeddings
N(0, 0.3^2), and LayerNorm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2), so
that no parameter is a trivial ones/zeros value that would hide a bug.

Learning-rate schedule (must equal dynmo's lr_at_step; step is 0-based):

    if step < warmup:  lr_step = lr * (step + 1) / warmup
    else:              ratio   = (step - warmup) / max(1, steps - warmup)
                       lr_step = lr * min_lr_ratio
                                 + 0.5 * (1 + cos(pi * ratio)) * (lr - lr * min_lr_ratio)

Each training step (0-based, on the same batch every step): zero the
gradients, forward (the loss recorded for that step is the loss BEFORE its
update, so train_losses[0] is the initial loss), backward, clip the gradients
to global L2 norm grad_clip (torch.nn.utils.clip_grad_norm_), then
torch.optim.AdamW with lr_step, betas (beta1, beta2), eps, and weight decay
only on the matrices and embeddings (wte, wpe, qkv_w, attproj_w, fc_w,
fcproj_w); AdamW counts its step t from 1.

File format: the DMREF header of fixture_lib.py, version 1, with no fields
of its own (the array count at offset 104, the arrays from 108).

Arrays, in this order:

    params        float32 (P)       all parameters in dynmo's canonical flat
                                    order: wte (V,C), wpe (max_seq,C), per
                                    block ln1_w ln1_b qkv_w qkv_b attproj_w
                                    attproj_b ln2_w ln2_b fc_w fc_b fcproj_w
                                    fcproj_b, then lnf_w, lnf_b; Linear
                                    weights (out, in) as torch stores them
    tokens        int32   (B*T)     inputs, row-major (B, T)
    targets       int32   (B*T)     targets, row-major (B, T)
    logits        float32 (B*T*V)   logits of the initial model, (B, T, V)
    loss          float32 (1)       mean cross-entropy of the initial model
    grads         float32 (P)       gradient of loss, same order as params;
                                    wte's includes the tied head's share
    lrs           float64 (steps)   lr_step for steps 0 .. steps-1
    train_losses  float32 (steps)   loss before the update of each step
"""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from fixture_lib import (HERE, GPTBase, batch_arrays, draw, grad_arrays, output, output_arrays,
                         schedule_arrays, train, write_fixture)

VERSION = 1
CONFIG = dict(vocab=256, max_seq=16, layers=2, heads=2, channels=32,
              batch=4, seq=16, steps=10, warmup=3)
SEED = 1234


class CausalSelfAttention(nn.Module):
    def __init__(self, channels, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(channels, 3 * channels)
        self.attproj = nn.Linear(channels, channels)

    def heads_of(self, x):
        """q, k, v (B, NH, T, hs) of x (B, T, C), and the scores q.k / sqrt(hs)."""
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, NH, T, hs): head h owns channels [h*hs, (h+1)*hs)
        q = q.view(B, T, self.heads, hs).transpose(1, 2)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)
        return q, k, v, (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v, scores = self.heads_of(x)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)
        return self.attproj(y)


class Block(nn.Module):
    def __init__(self, channels, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(channels, eps=1e-5)
        self.attn = CausalSelfAttention(channels, heads)
        self.ln2 = nn.LayerNorm(channels, eps=1e-5)
        self.fc = nn.Linear(channels, 4 * channels)
        self.fcproj = nn.Linear(4 * channels, channels)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def canonical_tensors(self):
        """The block's tensors in dynmo's block order (model.h)."""
        return [self.ln1.weight, self.ln1.bias,
                self.attn.qkv.weight, self.attn.qkv.bias,
                self.attn.attproj.weight, self.attn.attproj.bias,
                self.ln2.weight, self.ln2.bias,
                self.fc.weight, self.fc.bias,
                self.fcproj.weight, self.fcproj.bias]

    def matrices(self):
        return [self.attn.qkv.weight, self.attn.attproj.weight,
                self.fc.weight, self.fcproj.weight]


class GPT(GPTBase):
    """The dense GPT of config: its blocks add no loss."""
    def __init__(self, config):
        super().__init__(config, lambda l: Block(config["channels"], config["heads"]))

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets)


def build_fixture():
    model, tensors, tokens, targets = draw(SEED, CONFIG, lambda: GPT(CONFIG))
    arrays = batch_arrays(tensors, tokens, targets)
    logits, loss = model(tokens, targets)
    loss.backward()
    arrays += output_arrays(logits, loss) + grad_arrays(tensors)

    def step_loss(step):
        _, loss = model(tokens, targets)
        return loss, loss

    lrs, losses, _ = train(model, tensors, CONFIG, step_loss)
    return arrays + schedule_arrays(lrs, losses), losses


def main():
    out = output(__doc__, "--out", os.path.join(HERE, "fixture_tiny.bin"))
    arrays, losses = build_fixture()
    write_fixture(out, VERSION, CONFIG, b"", arrays)
    sizes = ", ".join(f"{name} {data.numel()}" for name, _, data in arrays)
    print(f"wrote {out} ({os.path.getsize(out)} bytes): {sizes}")
    print("train losses: " + " ".join(f"{x:.6f}" for x in losses))


if __name__ == "__main__":
    main()
