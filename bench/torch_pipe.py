#!/usr/bin/env python3
"""PyTorch 2.x pipeline peer of `dynmo bench` under each pipeline schedule.

The model of bench/torch_gpt.py (dynmo's GPT-2: tied head, pre-LN, GELU
tanh; the defaults are configs/ref.ini's shape) is cut into contiguous
chunks and run with torch.distributed.pipelining (PipelineStage and its
schedules) over gloo, one process per rank on the CPU, one thread each.
The training step is dynmo's: the batch in M micro-batches, mean
cross-entropy, the tied embedding's gradient summed between the chunk that
embeds and the one that projects to the vocabulary (each holds a copy of
the matrix, as dynmo's first and last stages do), global-norm clipping over
all ranks, AdamW with decay on matrices and embeddings only.

Schedules (those the installed torch has; the interleaved ones put
--virtual chunks on each rank, round robin, ZBV two in a V):
    1f1b            Schedule1F1B
    gpipe           ScheduleGPipe
    interleaved     ScheduleInterleaved1F1B
    interleaved-zb  ScheduleInterleavedZeroBubble
    zbv             ScheduleZBVZeroBubble

Per schedule, after --warmup-steps untimed steps, it times --steps steps on
one fixed batch of random tokens and prints one line:

    torch-pipe: SCHEDULE ranks P chunks N step MS ms bubble B% loss FIRST -> LAST ok

The step is the slowest rank's time for the step (the ranks leave a barrier
together); the bubble is dynmo's: the ranks' idle time over ranks x step,
where a rank is busy while it runs a chunk's forward, its loss, its
backward (input or weight part) or the optimizer. It exits 1 when a
schedule's first loss is far from ln(vocab) or its loss does not fall, and
2 on a bad argument. It never imports dynmo and writes nothing.

    /work/venv-torch2/bin/python bench/torch_pipe.py --ranks 2 [--steps 10] [--schedules 1f1b,interleaved]

bench/torch_pipe.sh runs it beside bench/schedules.sh (bench/README.md).
"""

import argparse
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from torch_gpt import GPT, add_model_arguments, lr_at_step

try:
    import torch.distributed.pipelining as pipelining
except ImportError:
    pipelining = None

# name: (class name in torch.distributed.pipelining, chunk placement)
SCHEDULES = {
    "1f1b": ("Schedule1F1B", "single"),
    "gpipe": ("ScheduleGPipe", "single"),
    "interleaved": ("ScheduleInterleaved1F1B", "loop"),
    "interleaved-zb": ("ScheduleInterleavedZeroBubble", "loop"),
    "zbv": ("ScheduleZBVZeroBubble", "v"),
}


def available_schedules():
    if pipelining is None:
        return []
    return [name for name, (cls, _) in SCHEDULES.items() if hasattr(pipelining, cls)]


class Chunk(nn.Module):
    """Blocks [first, last) of the model, with the embeddings when it is the
    first chunk and the final norm and (copied) tied head when it is the last."""

    def __init__(self, model, first, last, embeds, projects):
        super().__init__()
        self.embeds, self.projects = embeds, projects
        if embeds:
            self.wte, self.wpe = model.wte, model.wpe
        self.blocks = nn.ModuleList(model.blocks[first:last])
        if projects:
            self.lnf = model.lnf
            self.head = nn.Parameter(model.wte.weight.detach().clone())

    def forward(self, x):
        if self.embeds:
            x = self.wte(x) + self.wpe.weight[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.projects:
            x = F.linear(self.lnf(x), self.head)
        return x


def chunk_bounds(layers, chunks):
    """Blocks per chunk as even as they go, the first chunks one more."""
    base, extra = divmod(layers, chunks)
    bounds, start = [], 0
    for c in range(chunks):
        end = start + base + (c < extra)
        bounds.append((start, end))
        start = end
    return bounds


def stage_indices(placement, rank, ranks, virtual):
    if placement == "single":
        return [rank]
    if placement == "loop":
        return [rank + k * ranks for k in range(virtual)]
    return [rank, 2 * ranks - 1 - rank]   # "v": down the ranks and back


def chunks_of(placement, ranks, virtual):
    return ranks if placement == "single" else ranks * (2 if placement == "v" else virtual)


def rank_of_stage(placement, stage, ranks):
    if placement == "v" and stage >= ranks:
        return 2 * ranks - 1 - stage
    return stage % ranks


def run_schedule(name, rank, ranks, args):
    """Builds, trains and times one schedule; returns rank 0's summary."""
    cls_name, placement = SCHEDULES[name]
    n = chunks_of(placement, ranks, args.virtual)
    mine = stage_indices(placement, rank, ranks, args.virtual)
    torch.manual_seed(args.seed)   # every rank builds the same whole model
    model = GPT(args.vocab, args.max_seq, args.layers, args.heads, args.channels)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    bounds = chunk_bounds(args.layers, n)
    chunks = {s: Chunk(model, *bounds[s], s == 0, s == n - 1) for s in mine}
    del model
    device = torch.device("cpu")
    stages = [pipelining.PipelineStage(chunks[s], s, n, device) for s in mine]

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    schedule_cls = getattr(pipelining, cls_name)
    if placement == "single":
        schedule = schedule_cls(stages[0], args.micro_batches, loss_fn=loss_fn)
    else:
        schedule = schedule_cls(stages, args.micro_batches, loss_fn=loss_fn)

    # Busy time: the stages' compute and the loss, wrapped on these objects.
    busy = [0.0]

    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                busy[0] += time.perf_counter() - t0
        return wrapper

    for stage in stages:
        stage.forward_one_chunk = timed(stage.forward_one_chunk)
        stage.backward_one_chunk = timed(stage.backward_one_chunk)
        stage.backward_weight_one_chunk = timed(stage.backward_weight_one_chunk)
    schedule._compute_loss = timed(schedule._compute_loss)

    # The tied embedding: its two copies' gradients summed, over a group of
    # the two ranks when they differ (new_group is collective: every rank).
    embed_rank, head_rank = rank_of_stage(placement, 0, ranks), rank_of_stage(placement, n - 1, ranks)
    tie_group = None
    if embed_rank != head_rank:
        tie_group = dist.new_group([embed_rank, head_rank])
    embed = chunks[0].wte.weight if 0 in chunks else None
    head = chunks[n - 1].head if n - 1 in chunks else None

    params = [p for c in chunks.values() for p in c.parameters()]
    decayed = [p for p in params if p.dim() == 2]   # matrices, wte, wpe, the head copy
    others = [p for p in params if p.dim() != 2]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": args.weight_decay},
         {"params": others, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    norm_params = [p for p in params if p is not head]   # the tied matrix counted once

    total = args.warmup_steps + args.steps
    step_s, busy_s, losses = torch.zeros(total), torch.zeros(total), torch.zeros(total)
    for step in range(total):
        dist.barrier()
        busy[0] = 0.0
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at_step(step, args)
        optimizer.zero_grad(set_to_none=True)
        step_args = (inputs,) if 0 in chunks else ()
        mb_losses = [] if n - 1 in chunks else None
        step_kwargs = {"target": targets, "losses": mb_losses} if n - 1 in chunks else {}
        schedule.step(*step_args, return_outputs=False, **step_kwargs)
        if embed is not None and head is not None:
            total_grad = embed.grad + head.grad
            embed.grad.copy_(total_grad)
            head.grad.copy_(total_grad)
        elif tie_group is not None and (embed is not None or head is not None):
            dist.all_reduce((embed if embed is not None else head).grad, group=tie_group)
        grads = [p.grad for p in norm_params if p.grad is not None]
        square = torch.zeros(1)
        if grads:
            square += sum(g.pow(2).sum() for g in grads)
        dist.all_reduce(square)
        t1 = time.perf_counter()
        norm = math.sqrt(square.item())
        if norm > args.grad_clip:
            torch._foreach_mul_([p.grad for p in params if p.grad is not None],
                                args.grad_clip / (norm + 1e-6))
        optimizer.step()
        t2 = time.perf_counter()
        busy_s[step] = busy[0] + (t2 - t1)
        step_s[step] = t2 - t0
        if mb_losses is not None:
            losses[step] = torch.stack([loss.detach() for loss in mb_losses]).mean()

    # Every rank's step and busy times to rank 0; the loss from the head's rank.
    every_step = [torch.zeros(total) for _ in range(ranks)]
    every_busy = [torch.zeros(total) for _ in range(ranks)]
    dist.all_gather(every_step, step_s)
    dist.all_gather(every_busy, busy_s)
    dist.broadcast(losses, src=head_rank)
    if tie_group is not None:
        dist.destroy_process_group(tie_group)
    if rank != 0:
        return None
    step_ms, bubbles = [], []
    for s in range(args.warmup_steps, total):
        slowest = max(float(t[s]) for t in every_step)
        idle = sum(slowest - min(float(b[s]), slowest) for b in every_busy)
        step_ms.append(slowest * 1e3)
        bubbles.append(idle / (ranks * slowest))
    first, last = float(losses[0]), float(losses[-1])
    ok = abs(first - math.log(args.vocab)) < 0.5 and last < first
    print(f"torch-pipe: {name} ranks {ranks} chunks {n} step {statistics.median(step_ms):.1f} ms "
          f"bubble {100 * statistics.mean(bubbles):.1f}% loss {first:.4f} -> {last:.4f} "
          f"{'ok' if ok else 'WRONG (the loss did not start near ln(vocab) or did not fall)'}",
          flush=True)
    return ok


def worker(rank, ranks, port, args, failed):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        if rank == 0:
            print(f"torch-pipe: torch {torch.__version__}, gloo, {ranks} ranks x "
                  f"{torch.get_num_threads()} thread; V={args.vocab} L={args.layers} "
                  f"NH={args.heads} C={args.channels} B={args.batch} T={args.seq} "
                  f"in {args.micro_batches} micro-batches; {args.warmup_steps} warm-up + "
                  f"{args.steps} timed steps", flush=True)
        for name in args.schedules:
            ok = run_schedule(name, rank, ranks, args)
            if ok is False:
                failed.value = 1
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args():
    p = argparse.ArgumentParser(description="torch.distributed.pipelining peer of dynmo's schedules")
    p.add_argument("--ranks", type=int, required=True, help="processes, one pipeline rank each")
    p.add_argument("--schedules", default="",
                   help="comma-separated, of " + ", ".join(SCHEDULES) + " (default: all the "
                   "installed torch has)")
    p.add_argument("--list", action="store_true", help="print the schedules this torch has, exit")
    p.add_argument("--virtual", type=int, default=2, help="chunks per rank of the interleaved schedules")
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="timed steps (after warm-up)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    add_model_arguments(p, lr=6e-4, warmup=5, seed=1337)   # configs/ref.ini's
    args = p.parse_args()
    have = available_schedules()
    if not have:
        p.error(f"torch {torch.__version__} has no torch.distributed.pipelining schedules "
                "(torch 2.4 or later has them)")
    if args.list:
        print(" ".join(have))
        sys.exit(0)
    args.schedules = [s for s in args.schedules.split(",") if s] or have
    for s in args.schedules:
        if s not in SCHEDULES:
            p.error(f"unknown schedule {s!r}; known: {', '.join(SCHEDULES)}")
        if s not in have:
            p.error(f"schedule {s!r} needs torch.distributed.pipelining."
                    f"{SCHEDULES[s][0]}, which torch {torch.__version__} lacks")
    if args.ranks < 2:
        p.error("--ranks must be at least 2 (a pipeline)")
    if args.virtual < 1 or args.micro_batches < 1 or args.steps < 1 or args.threads < 1:
        p.error("--virtual, --micro-batches, --steps and --threads must be at least 1")
    if args.batch % args.micro_batches:
        p.error(f"--micro-batches {args.micro_batches} must divide --batch {args.batch}")
    if args.seq > args.max_seq or args.channels % args.heads:
        p.error("need --seq <= --max-seq and --heads dividing --channels")
    most = max(chunks_of(SCHEDULES[s][1], args.ranks, args.virtual) for s in args.schedules)
    if args.layers < most:
        p.error(f"--layers {args.layers} is fewer than the {most} chunks a schedule needs")
    args.total_steps = args.warmup_steps + args.steps
    return args


def main():
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    failed = mp.get_context("spawn").Value("i", 0)
    mp.spawn(worker, args=(args.ranks, free_port(), args, failed), nprocs=args.ranks, join=True)
    return 1 if failed.value else 0


if __name__ == "__main__":
    sys.exit(main())
