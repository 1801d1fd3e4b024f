"""Builds the whole-model PyTorch fixtures of mixture of depths and hash attention.

An independent PyTorch implementation of the GPT with mixture-of-depths
blocks and of the GPT with hash-sparse attention as docs/mod-hash.md
describes them (written from that description, not from dynmo's C code):
one forward and backward pass and ten AdamW steps on a tiny model, written
for tests/test_reference.c. It imports nothing of dynmo (only this
directory's fixture_lib.py and make_fixture.py's attention); the C test does
not need torch.

    /usr/bin/python3 tests/reference/make_mod_hash_model_fixture.py

Two fixtures, both vocab 64, max_seq 16, 2 layers, 2 heads, 16 channels,
batch 4 x 16, the ten steps and AdamW of fixture_lib.py:

fixture_mod_model.bin: block 1 is a MoD block (mod_every 2, capacity 0.25,
causal routing, predictor hidden width 8). For its input x (B, T, C): the
router r = x . w (w (C)); the top-k target, per sequence the k = ceil(0.25
T) = 4 tokens with the largest r (ties: the lower position); the
predictor, an MLP on stopgrad(x): logit = w2 . relu(W1 x + b1) + b2 (W1
(8, C), b1 (8), w2 (8), b2 (1)); the chosen tokens are those with logit >
0; each sequence's chosen tokens, in ascending position, run through the
ordinary block alone (causal attention among them), and a chosen token
leaves as x + r (f(x) - x); every other token leaves as x. The loss
trained is cross-entropy plus the mean binary cross-entropy of
sigmoid(logit) against the target (its gradient reaches the predictor
only). w, W1 and w2 are decayed like matrices, b1 and b2 are not; they sit
after the block's twelve tensors in the flat order (w, W1, b1, w2, b2).

fixture_hash_model.bin: every block's attention is hash-sparse with 4
buckets. Per (sequence, head), a query's or a key's bucket is the first
argmax of [x R ; -x R] with R (hs, 2) the head's rotation; query i attends to
key j when both have the same bucket and j <= i, and to its own key j = i in
any case; scale 1/sqrt(hs). The rotation of layer l at step s (0-based, the
step being run) is drawn as G[h][i][c] = normal(seed, stream, (h hs + i) 2 +
c), stream = 0x48415348 << 32 xor hash64(l, 0x726f74, s), with dynmo's
counter generator (docs/mod-hash.md): hash64(seed, stream, index) is
SplitMix64's finaliser mix applied as mix(mix(mix(seed + G) xor (stream +
S)) xor (index + I)); normal() is Box-Muller on hash64 at 2 index and 2
index + 1, rounded to float32. Then each column is divided by its norm:
R[h][i][c] = float32(G[h][i][c] / sqrt(sum over i' of G[h][i'][c]^2)), the
squares summed in float64 in order of i'.

The script redraws (the seed of tokens and weights) until every decision
(top-k gap, |logit|, bucket gap) in the forward and the ten steps is at
least DECISION_MARGIN away from a tie, so that float rounding cannot flip
it.

Format: "DMREF003", version 3: the version-1 header's first 104 bytes, then
int32 mod_every, mod_routing (0 top-k, 1 causal), hash_buckets,
mod_predictor_hidden (0 without causal routing), float64
mod_capacity, uint64 seed (the hash rotations'), then the array count and
the arrays as in version 1: params, tokens, targets, logits, loss, grads
(of the loss trained), lrs, train_losses (cross-entropy before each update),
and, with MoD, chosen (B*T the MoD block's choice in the first forward) and
bce (1, its BCE); with hash, rotation (layers x NH x hs x nb/2 at step 0).
"""

import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

from fixture_lib import (DTYPE_FLOAT32, DTYPE_INT32, GPTBase, Margins, batch_arrays, draw,
                         grad_arrays, init_weights, output, output_arrays, schedule_arrays,
                         train, write_fixture)
from make_fixture import CausalSelfAttention

VERSION = 3
CONFIG = dict(vocab=64, max_seq=16, layers=2, heads=2, channels=16,
              batch=4, seq=16, steps=10, warmup=3)
CASES = {
    "fixture_mod_model.bin": dict(mod_every=2, mod_routing=1, mod_capacity=0.25,
                                  mod_predictor_hidden=8, hash_buckets=0, seed=1234),
    "fixture_hash_model.bin": dict(mod_every=0, mod_routing=0, mod_capacity=0.0,
                                   mod_predictor_hidden=0, hash_buckets=4, seed=1234),
}
DECISION_MARGIN = 1e-4
MASK64 = (1 << 64) - 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK64
    return z ^ (z >> 31)


def hash64(seed, stream, index):
    h = mix64((seed + 0x9e3779b97f4a7c15) & MASK64)
    h = mix64(h ^ ((stream + 0x632be59bd9b4e019) & MASK64))
    return mix64(h ^ ((index + 0x85ebca77c2b2ae63) & MASK64))


def normal(seed, stream, index):
    a = hash64(seed, stream, 2 * index)
    b = hash64(seed, stream, 2 * index + 1)
    u1 = ((a >> 11) + 0.5) * (1.0 / 9007199254740992.0)
    u2 = (b >> 11) * (1.0 / 9007199254740992.0)
    return float(torch.tensor(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2),
                              dtype=torch.float32))


def rotation(seed, layer, step, heads, hs, buckets):
    half = buckets // 2
    stream = (0x48415348 << 32) ^ hash64(layer, 0x726f74, step)
    values = [normal(seed, stream, i) for i in range(heads * hs * half)]
    for h in range(heads):
        for c in range(half):
            column = [(h * hs + i) * half + c for i in range(hs)]
            squares = 0.0
            for e in column:
                squares += values[e] * values[e]
            norm = math.sqrt(squares)
            for e in column:
                values[e] = values[e] / norm
    return torch.tensor(values, dtype=torch.float32).reshape(heads, hs, half)


def buckets_of(x, R, margins):
    """x (B, NH, T, hs), R (NH, hs, half) -> (B, NH, T) first argmax of [xR ; -xR]."""
    proj = torch.einsum("bhti,hic->bhtc", x, R)
    both = torch.cat([proj, -proj], dim=-1).detach()
    top2 = both.topk(2, dim=-1).values
    margins.see((top2[..., 0] - top2[..., 1]).min())
    return both.argmax(dim=-1)


class Attention(CausalSelfAttention):
    """Causal attention, dense or hash-sparse (rotation set before each
    forward); the projections and heads are make_fixture.py's."""
    def __init__(self, channels, heads, margins):
        super().__init__(channels, heads)
        self.rotation = None
        self.margins = margins

    def forward(self, x):
        B, T, C = x.shape
        q, k, v, scores = self.heads_of(x)
        allowed = ~torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        allowed = allowed.expand(B, self.heads, T, T)
        if self.rotation is not None:
            bq = buckets_of(q, self.rotation, self.margins)
            bk = buckets_of(k, self.rotation, self.margins)
            own = torch.eye(T, dtype=torch.bool)
            allowed = (allowed & (bq[..., :, None] == bk[..., None, :])) | own
        probs = scores.masked_fill(~allowed, -1e30).softmax(dim=-1)
        probs = torch.where(allowed, probs, torch.zeros_like(probs))
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)
        return self.attproj(y)


class Block(nn.Module):
    def __init__(self, channels, heads, margins, mod):
        super().__init__()
        self.ln1 = nn.LayerNorm(channels, eps=1e-5)
        self.attn = Attention(channels, heads, margins)
        self.ln2 = nn.LayerNorm(channels, eps=1e-5)
        self.fc = nn.Linear(channels, 4 * channels)
        self.fcproj = nn.Linear(4 * channels, channels)
        self.mod = mod
        self.margins = margins
        if mod:
            hidden = mod["hidden"]
            self.router = nn.Parameter(torch.empty(channels))
            self.pred_w1 = nn.Parameter(torch.empty(hidden, channels))
            self.pred_b1 = nn.Parameter(torch.empty(hidden))
            self.pred_w2 = nn.Parameter(torch.empty(hidden))
            self.pred_b2 = nn.Parameter(torch.empty(1))
        self.last_chosen = None
        self.last_bce = None

    def dense(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    def forward(self, x):
        if not self.mod:
            return self.dense(x), 0.0
        B, T, C = x.shape
        k = max(1, min(T, math.ceil(self.mod["capacity"] * T - 1e-9)))
        r = x @ self.router
        order = torch.sort(-r.detach(), dim=1, stable=True).indices
        ranked = r.detach().gather(1, order)
        self.margins.see((ranked[:, k - 1] - ranked[:, k]).min())
        target = torch.zeros(B, T)
        target.scatter_(1, order[:, :k], 1.0)
        pre = x.detach() @ self.pred_w1.t() + self.pred_b1
        self.margins.see(pre.detach().abs().min())
        logit = F.relu(pre) @ self.pred_w2 + self.pred_b2
        self.margins.see(logit.detach().abs().min())
        chosen = logit.detach() > 0
        bce = F.binary_cross_entropy_with_logits(logit, target)
        out = x.clone()
        for b in range(B):
            idx = chosen[b].nonzero().reshape(-1)
            if idx.numel() == 0:
                continue
            xs = x[b, idx]
            f = self.dense(xs[None])[0]
            out[b, idx] = xs + r[b, idx, None] * (f - xs)
        self.last_chosen = chosen
        self.last_bce = bce.detach()
        return out, bce

    def canonical_tensors(self):
        t = [self.ln1.weight, self.ln1.bias, self.attn.qkv.weight, self.attn.qkv.bias,
             self.attn.attproj.weight, self.attn.attproj.bias, self.ln2.weight, self.ln2.bias,
             self.fc.weight, self.fc.bias, self.fcproj.weight, self.fcproj.bias]
        return t + ([self.router, self.pred_w1, self.pred_b1, self.pred_w2, self.pred_b2]
                    if self.mod else [])

    def matrices(self):
        m = [self.attn.qkv.weight, self.attn.attproj.weight, self.fc.weight, self.fcproj.weight]
        return m + ([self.router, self.pred_w1, self.pred_w2] if self.mod else [])


class GPT(GPTBase):
    """MoD blocks every mod_every (the blocks add their BCE), hash attention
    in every block with hash_buckets (set_step draws the rotations)."""
    def __init__(self, case, seed, margins):
        c = CONFIG
        every = case["mod_every"]
        mod = dict(capacity=case["mod_capacity"], hidden=case["mod_predictor_hidden"]) \
            if every else None
        super().__init__(c, lambda l: Block(c["channels"], c["heads"], margins,
                                            mod if every and (l + 1) % every == 0 else None))
        self.case = case
        self.seed = seed

    def set_step(self, step):
        nb, c = self.case["hash_buckets"], CONFIG
        for l, block in enumerate(self.blocks):
            if nb:
                block.attn.rotation = rotation(self.seed, l, step, c["heads"],
                                               c["channels"] // c["heads"], nb)


def init_mod(model, generator):
    """init_weights, then the MoD blocks' router and predictor."""
    init_weights(model, generator)
    with torch.no_grad():
        for block in model.blocks:
            if block.mod:
                block.router.copy_(torch.randn(CONFIG["channels"], generator=generator))
                block.pred_w1.copy_(torch.randn(block.pred_w1.shape, generator=generator))
                block.pred_b1.copy_(torch.randn(block.pred_b1.shape, generator=generator) * 0.1)
                block.pred_w2.copy_(torch.randn(block.pred_w2.shape, generator=generator))
                block.pred_b2.copy_(torch.randn(1, generator=generator) * 0.1)


def build_fixture(case, seed):
    margins = Margins()
    model, tensors, tokens, targets = draw(seed, CONFIG, lambda: GPT(case, seed, margins),
                                           init_mod)
    arrays = batch_arrays(tensors, tokens, targets)
    model.set_step(0)
    logits, loss, aux = model(tokens, targets)
    (loss + aux).backward()
    arrays += output_arrays(logits, loss) + grad_arrays(tensors)
    extra = []
    mods = [b for b in model.blocks if b.mod]
    if mods:
        extra += [("chosen", DTYPE_INT32, torch.cat([b.last_chosen.reshape(-1) for b in mods])),
                  ("bce", DTYPE_FLOAT32, torch.stack([b.last_bce for b in mods]).sum().reshape(1))]
    if case["hash_buckets"]:
        extra += [("rotation", DTYPE_FLOAT32,
                   torch.cat([b.attn.rotation.reshape(-1) for b in model.blocks]))]

    def step_loss(step):
        model.set_step(step)
        _, loss, aux = model(tokens, targets)
        return loss, loss + aux

    lrs, losses, _ = train(model, tensors, CONFIG, step_loss)
    return arrays + schedule_arrays(lrs, losses) + extra, losses, margins.smallest


def fields(case, seed):
    """Version 3's own header fields."""
    return (struct.pack("<4i", case["mod_every"], case["mod_routing"], case["hash_buckets"],
                        case["mod_predictor_hidden"]) +
            struct.pack("<dQ", case["mod_capacity"], seed))


def main():
    out_dir = output(__doc__)
    for name, case in CASES.items():
        seed = case["seed"]
        while True:
            arrays, losses, margin = build_fixture(case, seed)
            if margin >= DECISION_MARGIN:
                break
            seed += 1
        path = os.path.join(out_dir, name)
        write_fixture(path, VERSION, CONFIG, fields(case, seed), arrays)
        chosen = [a for a in arrays if a[0] == "chosen"]
        share = f", {int(chosen[0][2].sum())} of {chosen[0][2].numel()} chosen" if chosen else ""
        print(f"wrote {path} ({os.path.getsize(path)} bytes); seed {seed}, smallest decision "
              f"margin {margin:.3g}{share}")
        print("  train losses: " + " ".join(f"{x:.6f}" for x in losses))


if __name__ == "__main__":
    main()
