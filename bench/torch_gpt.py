#!/usr/bin/python3
"""PyTorch peer of dynmo's training step, for `dynmo bench` comparisons.

The same GPT-2 model as dynmo (model.h; also tests/reference/make_fixture.py,
which is the correctness reference: this file is written for speed) trained
with the same step: forward, mean cross-entropy, backward, global-norm
gradient clipping, AdamW with decay on matrices and embeddings only. It
trains on one fixed batch of random tokens, so the loss must fall: the run
fails (exit 1) if it does not, or if the first loss is far from ln(vocab).

It times 3 warm-up steps (not counted) and then --steps steps, and prints
the median ms/step, tokens/s and the peak resident set. It never imports
dynmo and writes nothing. Run with Debian's torch 1.13:

    /usr/bin/python3 bench/torch_gpt.py [--steps 10] [--threads N] ...

On a GPU (bench/gpu.sh, docs/gpu-bench.md), `--device cuda` runs the same
step there, timed between torch.cuda.synchronize() calls, and also prints
the peak device memory. fp32 means fp32: TF32 tensor-core products are off
(matmul and cuDNN) unless `--tf32` allows them, as dynmo's cuBLAS products
use TF32 only with train.precision = tf32. `--bf16` runs the forward and
the loss under torch.autocast to bfloat16 (fp32 weights and optimizer,
bf16 operands of the products): PyTorch's usual mixed precision, the peer
of train.precision = bf16, although autocast also keeps the products'
outputs in bf16 where dynmo's stay fp32. `--compile` wraps the model in
torch.compile (torch 2.x; the warm-up steps then include compiling).
The defaults are the reference config's shape (configs/ref.ini); GPT-2
small (configs/gpt2-small.ini) is

    --vocab 50304 --max-seq 1024 --layers 12 --heads 12 --channels 768 --batch 8 --seq 1024
"""

import argparse
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, channels, heads, max_seq):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.attproj = nn.Linear(channels, channels)
        self.ln2 = nn.LayerNorm(channels)
        self.fc = nn.Linear(channels, 4 * channels)
        self.fcproj = nn.Linear(4 * channels, channels)
        # Additive causal mask: 0 on and below the diagonal, -inf above.
        mask = torch.full((max_seq, max_seq), float("-inf")).triu(diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        # (B, T, 3C) -> 3 x (B*NH, T, hs), heads split along C
        qkv = self.qkv(x).view(B, T, 3, self.heads, hs).permute(2, 0, 3, 1, 4)
        q, k, v = (t.reshape(B * self.heads, T, hs) for t in qkv.unbind(0))
        # scores = mask + scale * q k^T in one call, then softmax over keys
        scores = torch.baddbmm(self.mask[:T, :T], q, k.transpose(1, 2),
                               alpha=1.0 / math.sqrt(hs))
        y = torch.bmm(scores.softmax(dim=-1), v)
        return y.view(B, self.heads, T, hs).transpose(1, 2).reshape(B, T, C)

    def forward(self, x):
        x = x + self.attproj(self.attention(self.ln1(x)))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, max_seq, layers, heads, channels):
        super().__init__()
        self.wte = nn.Embedding(vocab, channels)
        self.wpe = nn.Embedding(max_seq, channels)
        self.blocks = nn.ModuleList(Block(channels, heads, max_seq) for _ in range(layers))
        self.lnf = nn.LayerNorm(channels)
        # GPT-2 init, as dynmo's block_init: N(0, 0.02), residual projections
        # scaled by 1/sqrt(2 layers), zero biases, unit norms.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets):
        B, T = tokens.shape
        x = self.wte(tokens) + self.wpe.weight[:T]
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # head tied to wte
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))

    def param_groups(self, weight_decay):
        decayed = [p for p in self.parameters() if p.dim() == 2]  # matrices, wte, wpe
        others = [p for p in self.parameters() if p.dim() != 2]
        return [{"params": decayed, "weight_decay": weight_decay},
                {"params": others, "weight_decay": 0.0}]


def lr_at_step(step, args):
    """dynmo's schedule: linear warm-up, then cosine to lr * min_lr_ratio."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    ratio = (step - args.warmup) / max(1, args.total_steps - args.warmup)
    min_lr = args.lr * args.min_lr_ratio
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - min_lr)


def add_model_arguments(p, lr=3e-4, warmup=2, seed=1234):
    """The model, batch and optimizer flags (also bench/torch_pipe.py's);
    the shape defaults are configs/ref.ini's."""
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--max-seq", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=warmup, help="learning-rate warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=seed)


def parse_args():
    p = argparse.ArgumentParser(description="PyTorch peer of dynmo's training step")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after warm-up)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first")
    add_model_arguments(p)
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads(N); 0 keeps torch's default")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    precision = p.add_mutually_exclusive_group()
    precision.add_argument("--tf32", action="store_true",
                           help="on cuda, allow TF32 tensor-core products (off by default: fp32)")
    precision.add_argument("--bf16", action="store_true",
                           help="torch.autocast the forward and loss to bfloat16 (fp32 weights)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2.x)")
    args = p.parse_args()
    if args.steps < 1 or args.seq > args.max_seq or args.channels % args.heads:
        p.error("need --steps >= 1, --seq <= --max-seq, --heads dividing --channels")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch %s sees no CUDA device" % torch.__version__)
    if args.compile and not hasattr(torch, "compile"):
        p.error("--compile needs torch 2.x (this is torch %s)" % torch.__version__)
    args.total_steps = args.warmup_steps + args.steps
    return args


def main():
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(args.seed)
    # Built and initialised on the CPU, then moved: the same weights and
    # tokens on either device for a seed.
    model = GPT(args.vocab, args.max_seq, args.layers, args.heads, args.channels).to(args.device)
    optimizer = torch.optim.AdamW(model.param_groups(args.weight_decay), lr=args.lr,
                                  betas=(0.9, 0.95), eps=1e-8, foreach=True)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1)).to(args.device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    params = list(model.parameters())
    step_model = torch.compile(model) if args.compile else model

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    losses, times = [], []
    for step in range(args.total_steps):
        synchronize()
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at_step(step, args)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.bf16):
            loss = step_model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        synchronize()
        times.append(time.perf_counter() - start)

    timed = times[args.warmup_steps:]
    median = statistics.median(timed)
    tokens_per_step = args.batch * args.seq
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    nparams = sum(p.numel() for p in params)
    if cuda:
        where = (f"{torch.cuda.get_device_name()}, TF32 {'on' if args.tf32 else 'off'}"
                 f"{', bf16 autocast' if args.bf16 else ''}{', compiled' if args.compile else ''}")
    else:
        where = (f"threads {torch.get_num_threads()}{', bf16 autocast' if args.bf16 else ''}"
                 f"{', compiled' if args.compile else ''}")
    print(f"torch {torch.__version__} on {args.device}: {where}, "
          f"{nparams} params, V={args.vocab} S={args.max_seq} L={args.layers} "
          f"NH={args.heads} C={args.channels} B={args.batch} T={args.seq}")
    print(f"steps: {args.warmup_steps} warm-up + {len(timed)} timed; ms/step "
          f"median {median * 1e3:.1f} min {min(timed) * 1e3:.1f} max {max(timed) * 1e3:.1f}")
    device_memory = (f"; peak device memory {torch.cuda.max_memory_allocated() / 1048576.0:.0f} MiB"
                     if cuda else "")
    print(f"tokens/s {tokens_per_step / median:.0f}; peak RSS {peak_rss_mib:.1f} MiB{device_memory}")
    print(f"loss first {losses[0]:.4f} last {losses[-1]:.4f} (ln V = {math.log(args.vocab):.4f})")

    if not (abs(losses[0] - math.log(args.vocab)) < 0.5 and losses[-1] < losses[0]):
        print("error: the loss did not start near ln(vocab) or did not fall", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
