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

File format (all little-endian):

    offset  type          field
    0       char[8]       magic "DMREF001"
    8       uint32        version = 1
    12      int32[9]      vocab, max_seq, layers, heads, channels,
                          batch, seq, steps, warmup
    48      float64[7]    lr, min_lr_ratio, beta1, beta2, eps,
                          weight_decay, grad_clip
    104     uint32        number of arrays that follow
    108     arrays, each:
              char[16]    name, NUL-padded ASCII
              uint32      dtype: 0 = float32, 1 = int32, 2 = float64
              int32       count (elements)
              count * 4 or 8 bytes of data

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

import argparse
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

MAGIC = b"DMREF001"
VERSION = 1
DTYPE_FLOAT32, DTYPE_INT32, DTYPE_FLOAT64 = 0, 1, 2

CONFIG = dict(vocab=256, max_seq=16, layers=2, heads=2, channels=32,
              batch=4, seq=16, steps=10, warmup=3)
HYPER = dict(lr=1e-3, min_lr_ratio=0.1, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, grad_clip=1.0)
SEED = 1234


class CausalSelfAttention(nn.Module):
    def __init__(self, channels, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(channels, 3 * channels)
        self.attproj = nn.Linear(channels, channels)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, NH, T, hs): head h owns channels [h*hs, (h+1)*hs)
        q = q.view(B, T, self.heads, hs).transpose(1, 2)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
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


class GPT(nn.Module):
    def __init__(self, vocab, max_seq, layers, heads, channels):
        super().__init__()
        self.wte = nn.Embedding(vocab, channels)
        self.wpe = nn.Embedding(max_seq, channels)
        self.blocks = nn.ModuleList(Block(channels, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(channels, eps=1e-5)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # head tied to wte
        loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss

    def canonical_tensors(self):
        tensors = [self.wte.weight, self.wpe.weight]
        for block in self.blocks:
            tensors += block.canonical_tensors()
        return tensors + [self.lnf.weight, self.lnf.bias]

    def decayed(self):
        """Parameters that receive weight decay: matrices and embeddings."""
        tensors = [self.wte.weight, self.wpe.weight]
        for block in self.blocks:
            tensors += block.matrices()
        return tensors


def lr_at_step(step, lr, min_lr_ratio, warmup, steps):
    if step < warmup:
        return lr * (step + 1) / warmup
    ratio = (step - warmup) / max(1, steps - warmup)
    min_lr = lr * min_lr_ratio
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def init_weights(model, generator):
    """Perturbs what torch's module init leaves trivial (see the docstring)."""
    with torch.no_grad():
        for embedding in (model.wte, model.wpe):
            embedding.weight.copy_(torch.randn(embedding.weight.shape, generator=generator) * 0.3)
        norms = [model.lnf] + [n for b in model.blocks for n in (b.ln1, b.ln2)]
        for norm in norms:
            norm.weight.copy_(1.0 + 0.1 * torch.randn(norm.weight.shape, generator=generator))
            norm.bias.copy_(0.1 * torch.randn(norm.bias.shape, generator=generator))


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def build_fixture():
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    c, h = CONFIG, HYPER
    model = GPT(c["vocab"], c["max_seq"], c["layers"], c["heads"], c["channels"])
    init_weights(model, generator)
    tensors = model.canonical_tensors()
    assert len(tensors) == len(list(model.parameters()))

    shape = (c["batch"], c["seq"])
    tokens = torch.randint(0, c["vocab"], shape, generator=generator)
    targets = torch.randint(0, c["vocab"], shape, generator=generator)

    arrays = [("params", DTYPE_FLOAT32, flat(tensors))]
    logits, loss = model(tokens, targets)
    loss.backward()
    arrays += [("tokens", DTYPE_INT32, tokens.reshape(-1)),
               ("targets", DTYPE_INT32, targets.reshape(-1)),
               ("logits", DTYPE_FLOAT32, logits.detach().reshape(-1)),
               ("loss", DTYPE_FLOAT32, loss.detach().reshape(1)),
               ("grads", DTYPE_FLOAT32, flat([t.grad for t in tensors]))]

    decayed_ids = {id(t) for t in model.decayed()}
    groups = [{"params": [t for t in tensors if id(t) in decayed_ids],
               "weight_decay": h["weight_decay"]},
              {"params": [t for t in tensors if id(t) not in decayed_ids],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=h["lr"], betas=(h["beta1"], h["beta2"]),
                                  eps=h["eps"])
    lrs, losses = [], []
    for step in range(c["steps"]):
        lr = lr_at_step(step, h["lr"], h["min_lr_ratio"], c["warmup"], c["steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=False)
        _, loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tensors, h["grad_clip"])
        optimizer.step()
        lrs.append(lr)
        losses.append(loss.item())
    arrays += [("lrs", DTYPE_FLOAT64, torch.tensor(lrs, dtype=torch.float64)),
               ("train_losses", DTYPE_FLOAT32, torch.tensor(losses, dtype=torch.float32))]
    return arrays, losses


def write_records(path, header, arrays):
    """Writes header then each (name, dtype, tensor) record to path, atomically."""
    formats = {DTYPE_FLOAT32: ("<f4", torch.float32), DTYPE_INT32: ("<i4", torch.int32),
               DTYPE_FLOAT64: ("<f8", torch.float64)}
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        for name, dtype, data in arrays:
            numpy_format, torch_type = formats[dtype]
            values = data.to(torch_type).contiguous().numpy().astype(numpy_format)
            f.write(struct.pack("<16sIi", name.encode("ascii"), dtype, values.size))
            f.write(values.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def config_header(magic, version, config, hyper):
    """The 104 bytes every fixture starts with: magic, version, the model
    and run sizes, the optimizer's hyperparameters."""
    header = magic + struct.pack("<I", version)
    header += struct.pack("<9i", *(config[k] for k in
                                   ("vocab", "max_seq", "layers", "heads", "channels",
                                    "batch", "seq", "steps", "warmup")))
    header += struct.pack("<7d", *(hyper[k] for k in
                                   ("lr", "min_lr_ratio", "beta1", "beta2", "eps",
                                    "weight_decay", "grad_clip")))
    assert len(header) == 104
    return header


def write_fixture(path, arrays):
    header = config_header(MAGIC, VERSION, CONFIG, HYPER)
    header += struct.pack("<I", len(arrays))
    assert len(header) == 108
    write_records(path, header, arrays)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(here, "fixture_tiny.bin"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    arrays, losses = build_fixture()
    write_fixture(args.out, arrays)
    sizes = ", ".join(f"{name} {data.numel()}" for name, _, data in arrays)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes): {sizes}")
    print("train losses: " + " ".join(f"{x:.6f}" for x in losses))


if __name__ == "__main__":
    main()
