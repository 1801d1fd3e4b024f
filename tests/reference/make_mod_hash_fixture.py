#!/usr/bin/python3
"""Builds the PyTorch reference fixture of dynmo's hash-sparse attention and
mixture-of-depths block (docs/mod-hash.md), an independent implementation
written from that description; it imports nothing of dynmo, and the C test
(tests/test_hash_mod.c) never needs torch.

    /usr/bin/python3 tests/reference/make_mod_hash_fixture.py [--out FILE]

writes tests/reference/fixture_mod_hash.bin. Everything is computed in
float64 and stored as float32.

Hash-sparse attention, per (sequence, head), head size hs, nb buckets, a
rotation R (hs, nb/2) per head whose columns have unit norm:
    bucket(x) = argmax([x R ; -x R])   (queries and keys hashed alike)
    query i attends to key j iff bucket(q_i) == bucket(k_j) and j <= i,
    and to its own key j = i in any case
    softmax over the allowed scores q.k / sqrt(hs)
Stored: qkv (B,T,3C), R (NH,hs,nb/2), dout (B,T,C), out (B,T,C), dqkv.

The MoD block: the GPT-2 block (ln1, qkv, causal attention, attproj,
residual, ln2, fc, gelu tanh, fcproj, residual) in dynmo's parameter order,
router r = x . w, the capacity x T tokens of each sequence with the
largest r chosen, gathered in ascending position, f = block(gathered), and
out = x + r (f - x) for a chosen token, x otherwise. The predictor, an
MLP of hidden width H on x detached: logit = w2 . relu(W1 x + b1) + b2,
the mean BCE of sigmoid(logit) against the chosen mask. Stored: params,
x (B,T,C), router_w (C), chosen (B*T int32), dout, out, dx, drouter_w,
dparams, predictor_hidden (1 int32), predictor_w (H C + 2 H + 1: W1 (H,
C) row-major, b1 (H), w2 (H), b2), predictor_loss (1), dpredictor_w.

Format (little-endian): magic "DMMODH01", uint32 array count, then per
array: uint32 name length, the name, uint32 kind (0 float32, 1 int32),
uint64 element count, the elements.
"""
import argparse
import math
import struct

import torch

torch.manual_seed(4321)
D = torch.float64


def hash_buckets(x, R):
    proj = x @ R
    both = torch.cat([proj, -proj], dim=-1)
    top2 = both.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1]).min().item()
    return both.argmax(dim=-1), margin


def hash_attention(qkv, R, B, T, C, NH, nb):
    hs = C // NH
    q, k, v = qkv.split(C, dim=-1)
    out = torch.zeros(B, T, C, dtype=D)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    own = torch.eye(T, dtype=torch.bool)
    margin = math.inf
    outs = []
    for b in range(B):
        heads = []
        for h in range(NH):
            qh = q[b, :, h * hs:(h + 1) * hs]
            kh = k[b, :, h * hs:(h + 1) * hs]
            vh = v[b, :, h * hs:(h + 1) * hs]
            bq, m1 = hash_buckets(qh.detach(), R[h])
            bk, m2 = hash_buckets(kh.detach(), R[h])
            margin = min(margin, m1, m2)
            allowed = ((bq[:, None] == bk[None, :]) & causal) | own
            s = (qh @ kh.T) / math.sqrt(hs)
            s = s.masked_fill(~allowed, -math.inf)
            heads.append(torch.softmax(s, dim=-1) @ vh)
        outs.append(torch.cat(heads, dim=-1))
    out = torch.stack(outs)
    return out, margin


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def block(x, P, NH):
    (ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b,
     fc_w, fc_b, fcproj_w, fcproj_b) = P
    B, T, C = x.shape
    hs = C // NH
    h = torch.nn.functional.layer_norm(x, (C,), ln1_w, ln1_b, 1e-5)
    qkv = h @ qkv_w.T + qkv_b
    q, k, v = qkv.split(C, dim=-1)
    q = q.view(B, T, NH, hs).transpose(1, 2)
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
    s = s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), -math.inf)
    y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    res1 = x + y @ attproj_w.T + attproj_b
    h2 = torch.nn.functional.layer_norm(res1, (C,), ln2_w, ln2_b, 1e-5)
    return res1 + gelu_tanh(h2 @ fc_w.T + fc_b) @ fcproj_w.T + fcproj_b


def block_params(C):
    shapes = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,),
              (4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    return [(torch.randn(*s, dtype=D) * 0.2).requires_grad_() for s in shapes]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/reference/fixture_mod_hash.bin")
    args = ap.parse_args()
    arrays = []

    def put(name, t, kind=0):
        arrays.append((name, kind, t.detach().reshape(-1)))

    # hash-sparse attention: B 2, T 64, C 16, NH 2, 4 buckets
    B, T, C, NH, nb = 2, 64, 16, 2, 4
    hs = C // NH
    for _ in range(100):
        qkv = torch.randn(B, T, 3 * C, dtype=D).requires_grad_()
        R = torch.randn(NH, hs, nb // 2, dtype=D)
        R = R / R.norm(dim=1, keepdim=True)
        out, margin = hash_attention(qkv, R, B, T, C, NH, nb)
        if margin > 1e-3:
            break
    else:
        raise SystemExit("no draw without a bucket tie within 1e-3")
    dout = torch.randn(B, T, C, dtype=D)
    (out * dout).sum().backward()
    put("hash.qkv", qkv)
    put("hash.rotation", R)
    put("hash.dout", dout)
    put("hash.out", out)
    put("hash.dqkv", qkv.grad)

    # the MoD block: B 2, T 12, C 16, NH 2, capacity 0.5
    B, T, C, NH, capacity = 2, 12, 16, 2, 0.5
    k = math.ceil(capacity * T)
    P = block_params(C)
    x = torch.randn(B, T, C, dtype=D).requires_grad_()
    w = (torch.randn(C, dtype=D) * 0.3).requires_grad_()
    r = x @ w
    top = r.detach().topk(k, dim=1)
    gap = (top.values[:, k - 1] - r.detach().topk(k + 1, dim=1).values[:, k]).min().item()
    if gap < 1e-3:
        raise SystemExit("the top-k choice is within 1e-3 of a tie; change the seed")
    idx = top.indices.sort(dim=1).values
    chosen = torch.zeros(B, T, dtype=torch.int32)
    for b in range(B):
        chosen[b, idx[b]] = 1
    gathered = torch.stack([x[b, idx[b]] for b in range(B)])
    f = block(gathered, P, NH)
    out = x.clone()
    for b in range(B):
        rb = r[b, idx[b]][:, None]
        out[b, idx[b]] = gathered[b] + rb * (f[b] - gathered[b])
    dout = torch.randn(B, T, C, dtype=D)
    (out * dout).sum().backward()
    put("mod.params", torch.cat([p.reshape(-1) for p in P]))
    put("mod.x", x)
    put("mod.router_w", w)
    put("mod.chosen", chosen, 1)
    put("mod.dout", dout)
    put("mod.out", out)
    put("mod.dx", x.grad)
    put("mod.drouter_w", w.grad)
    put("mod.dparams", torch.cat([p.grad.reshape(-1) for p in P]))
    H = 8
    w1 = (torch.randn(H, C, dtype=D) * 0.5).requires_grad_()
    b1 = (torch.randn(H, dtype=D) * 0.5).requires_grad_()
    w2 = (torch.randn(H, dtype=D) * 0.5).requires_grad_()
    b2 = (torch.randn(1, dtype=D) * 0.5).requires_grad_()
    pre = x.detach().reshape(-1, C) @ w1.T + b1
    if pre.abs().min().item() < 1e-3:
        raise SystemExit("a hidden unit is within 1e-3 of its ReLU kink; change the seed")
    logits = torch.relu(pre) @ w2 + b2
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, chosen.reshape(-1).to(D))
    loss.backward()
    predictor = [w1, b1, w2, b2]
    put("mod.predictor_hidden", torch.tensor([H]), 1)
    put("mod.predictor_w", torch.cat([p.reshape(-1) for p in predictor]))
    put("mod.predictor_loss", loss.reshape(1))
    put("mod.dpredictor_w", torch.cat([p.grad.reshape(-1) for p in predictor]))

    with open(args.out, "wb") as fh:
        fh.write(b"DMMODH01")
        fh.write(struct.pack("<I", len(arrays)))
        for name, kind, t in arrays:
            fh.write(struct.pack("<I", len(name)))
            fh.write(name.encode())
            fh.write(struct.pack("<IQ", kind, t.numel()))
            if kind == 0:
                fh.write(t.to(torch.float32).numpy().astype("<f4").tobytes())
            else:
                fh.write(t.to(torch.int32).numpy().astype("<i4").tobytes())
    print(f"wrote {args.out}: {len(arrays)} arrays; hash bucket margin {margin:.3g}, "
          f"top-k gap {gap:.3g}")


if __name__ == "__main__":
    main()
