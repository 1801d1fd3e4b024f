#!/usr/bin/python3
"""Builds the PyTorch reference fixtures of early exit (CALM) and layer freezing.

An independent PyTorch implementation, written from the papers and from the
semantics docs/dynamism.md states (not from dynmo's C code), of a tiny GPT
trained with CALM-style token-level early exit (Schuster et al., "Confident
Adaptive Language Modeling", NeurIPS 2022) and of one trained with blocks
frozen (AutoFreeze / Egeria / PipeTransformer style), for
tests/test_exit_reference.c. It imports nothing of dynmo (only this
directory's fixture_lib.py and the dense model of make_fixture.py); the C
test does not need torch.

    /usr/bin/python3 tests/reference/make_exit_fixture.py

Every fixture: vocab 256, max_seq 16, 4 layers, 2 heads, 32 channels, batch
4 x 16, weights and batch drawn as in make_fixture.py (seed 1234), eight
AdamW steps with the learning-rate schedule, clipping and weight decay of
fixture_lib.py (lr 1e-3, warmup 3). The computation runs in float64; the
fixture stores float32.

Early exit (CALM, section 3). After block l (0-based; CALM's layer i = l + 1)
for l in from .. layers-2, every token t still active gets a confidence:

  softmax    the softmax response: top-1 minus top-2 of
             softmax(W lnf(h_t^l)), the probabilities of the shared output
             head (the final LayerNorm and the LM head tied to wte) applied
             to the token's state after the block;
  saturation the hidden-state saturation: cos(h_t^l, h_t^{l-1}), the
             cosine similarity of the token's state after the block with its
             state before it (the previous layer's output).

CALM exits a token when its confidence exceeds the threshold; the token's
state is then copied to every layer above it, and the copies serve later
tokens as keys and values (CALM 3.2, "state propagation"): layer j > l
computes the token's K and V from the copied state with its own LayerNorm
and projections. In a teacher-forced forward that is: every block computes
causal attention over all tokens' current states, and an exited token's
state leaves the block unchanged (the block's output for it is discarded).
A token that leaves after block l has exit layer l; an active one has
`layers`.

The training loss (CALM 3.4): per-layer losses L_i with weights
w_i = i / sum_j j over the layers that have a loss. The reference computes
CALM's w_i over the exit heads from..layers-2 and the final layer (1-based
indices, normalised over those layers). dynmo's documented objective
(docs/dynamism.md) differs from CALM's in three deliberate ways, and the
reference follows the documentation:

  - the final loss keeps weight 1 and the exit losses are scaled by
    lambda = dyn.exit_loss_weight:
        loss = L_final + lambda * sum_{l=from}^{layers-2} w_l L_l
    (CALM: sum_i w_i L_i, the final layer's weight w_L included);
  - dynmo trains with exits taking effect, so an exit head's loss covers
    the tokens active at its block: L_l = sum over tokens active at l of
    the cross-entropy, divided by all B*T tokens (CALM trains every layer
    on every token);
  - the exit losses do not train the head: the exit heads read the LM head
    and final LayerNorm detached (the final loss trains them).

A token exits when confidence >= threshold, from step dyn.exit_warmup on
(before, the exit losses train and no token leaves). The threshold of each
fixture is chosen by this script among quantiles of the confidences, and the
script refuses a fixture in which any decision (an active token's confidence
at a block where it may leave, in the first forward and every training step)
lies within DECISION_MARGIN of the threshold, so that float rounding cannot
flip an exit.

Freezing (AutoFreeze, Egeria, PipeTransformer): a frozen block computes no
weight gradients and its parameters and Adam moments stop changing: PyTorch
with its parameters' requires_grad off, so AdamW skips them. Frozen blocks
that form a prefix [0, k) are frozen with everything before them, the
embedding included: that prefix runs without autograd (AutoFreeze and
PipeTransformer do no backward for it), so wpe gets no gradient and no
update and wte trains only through the LM head it is tied to. A frozen block
after an unfrozen one still passes the gradient to the blocks below it.
Blocks freeze at step boundaries and never thaw.

Format: "DMREF004", version 4: the version-1 header's first 104 bytes, then
int32 kind (0 early exit, 1 freeze), exit_from, exit_confidence (0 softmax,
1 saturation), exit_warmup, float64 exit_threshold, exit_loss_weight, then
the array count and the arrays as in version 1.

Early-exit arrays: params, tokens, targets; of one forward and backward of
the initial model with exits allowed: logits (B*T*V, the final head's, with
the exited tokens' copied states), loss (1, L_final), exit_loss (1, lambda
sum_l w_l L_l), grads (P, of the documented loss), exit_layer (B*T),
confidence (layers x B*T: every token's confidence at each block where
tokens may leave, NaN at the others); CALM's terms without exits:
layer_losses (layers: L_l over every token for l in from..layers-2, the
final loss at layers-1, NaN below from), exit_weights (float64 layers:
CALM's w_l, 0 below from); then lrs, train_losses (L_final before each
update), train_totals (the documented loss), train_exits (steps x B*T exit
layers of each step).

Freeze arrays: params, tokens, targets, frozen_from (layers: the step from
which each block is frozen, -1 never), lrs, train_losses, last_grads (P, the
gradients of the last step, zero for what is frozen), final_params,
final_m, final_v (P each, after the last update: AdamW's exp_avg and
exp_avg_sq; zero for a tensor never updated).
"""

import math
import os
import struct

import torch
import torch.nn.functional as F

from fixture_lib import (DTYPE_FLOAT32, DTYPE_FLOAT64, DTYPE_INT32, HYPER, Margins, adamw,
                         batch_arrays, draw, flat, grad_arrays, output, output_arrays,
                         schedule_arrays, set_lr, train, write_fixture)
from make_fixture import GPT

VERSION = 4
CONFIG = dict(vocab=256, max_seq=16, layers=4, heads=2, channels=32,
              batch=4, seq=16, steps=8, warmup=3)
SEED = 1234
DECISION_MARGIN = 1e-4
KIND_EXIT, KIND_FREEZE = 0, 1
SOFTMAX, SATURATION = 0, 1
CASES = {
    "fixture_exit_softmax.bin": dict(kind=KIND_EXIT, exit_from=0, confidence=SOFTMAX,
                                     exit_warmup=0, loss_weight=1.0),
    "fixture_exit_saturation.bin": dict(kind=KIND_EXIT, exit_from=1, confidence=SATURATION,
                                        exit_warmup=2, loss_weight=0.5),
    # block 2 alone from step 2 (not a prefix), block 0 from step 4 (prefix 1,
    # the embedding with it), block 1 from step 6 (prefix 3); block 3 never
    "fixture_freeze.bin": dict(kind=KIND_FREEZE, frozen_from=[4, 6, 2, -1]),
}


def as_float32(x):
    """x rounded to the nearest float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def build_model():
    """make_fixture.py's draw of the model and batch, the model in float64;
    the arrays of the parameters (float32, as drawn) and the batch."""
    model, tensors, tokens, targets = draw(SEED, CONFIG, lambda: GPT(CONFIG))
    start = batch_arrays(tensors, tokens, targets)
    return model.double(), tokens, targets, start


# ---- early exit -------------------------------------------------------------------------

def calm_weights(layers, first):
    """CALM's w_i = i / sum_j j over the layers with a loss: the exit heads
    after blocks first..layers-2 and the final layer (i = block + 1)."""
    total = sum(l + 1 for l in range(first, layers))
    return [0.0 if l < first else (l + 1) / total for l in range(layers)]


def confidence_of(measure, logits, state, previous):
    if measure == SOFTMAX:   # CALM's softmax response
        top = logits.softmax(dim=-1).topk(2, dim=-1).values
        return top[..., 0] - top[..., 1]
    # CALM's hidden-state saturation: cos(h^l, h^{l-1})
    return (state * previous).sum(-1) / (state.norm(dim=-1) * previous.norm(dim=-1))


def exit_forward(model, tokens, targets, case, threshold, allow, margins=None):
    """One forward with early exit. Returns the final logits and loss,
    lambda * sum_l w_l L_l, the exit layers, the confidences (layers, B, T)
    and the per-layer exit losses L_l (NaN where no head)."""
    B, T = tokens.shape
    N, L, C = B * T, len(model.blocks), CONFIG["channels"]
    first, lam = case["exit_from"], case["loss_weight"]
    weights = calm_weights(L, first)
    # The exit heads read the shared head without training it (docs/dynamism.md).
    head_w, norm_w, norm_b = (model.wte.weight.detach(), model.lnf.weight.detach(),
                              model.lnf.bias.detach())
    x = model.wte(tokens) + model.wpe(torch.arange(T))
    exit_layer = torch.full((B, T), L, dtype=torch.long)
    confidence = torch.full((L, B, T), math.nan, dtype=torch.float64)
    layer_losses = [math.nan] * L
    exit_loss = torch.zeros((), dtype=torch.float64)
    for l, block in enumerate(model.blocks):
        active = exit_layer >= l
        # Every token's current state is a key and value; an exited token's
        # state is copied past the block.
        x_next = torch.where(active.unsqueeze(-1), block(x), x)
        if first <= l <= L - 2:
            logits = F.layer_norm(x_next, (C,), norm_w, norm_b, 1e-5) @ head_w.t()
            ce = F.cross_entropy(logits.reshape(N, -1), targets.reshape(N),
                                 reduction="none").view(B, T)
            layer_loss = (ce * active).sum() / N
            layer_losses[l] = layer_loss.item()
            exit_loss = exit_loss + lam * weights[l] * layer_loss
            conf = confidence_of(case["confidence"], logits, x_next, x).detach()
            confidence[l] = conf
            if allow:
                if margins is not None:
                    margins.see((conf[active] - threshold).abs())
                exit_layer = torch.where(active & (conf >= threshold),
                                         torch.full_like(exit_layer, l), exit_layer)
        x = x_next
    logits = model.lnf(x) @ model.wte.weight.t()
    loss = F.cross_entropy(logits.view(N, -1), targets.view(N))
    return logits, loss, exit_loss, exit_layer, confidence, layer_losses


def build_exit(case, threshold):
    """The fixture's arrays for one threshold, with its smallest decision
    margin and the share of tokens that left in the first forward."""
    model, tokens, targets, arrays = build_model()
    tensors = model.canonical_tensors()
    L = CONFIG["layers"]
    margins = Margins()
    logits, loss, exit_loss, exit_layer, confidence, _ = exit_forward(
        model, tokens, targets, case, threshold, True, margins)
    (loss + exit_loss).backward()
    arrays += output_arrays(logits, loss)
    arrays += [("exit_loss", DTYPE_FLOAT32, exit_loss.detach().reshape(1))]
    arrays += grad_arrays(tensors)
    arrays += [("exit_layer", DTYPE_INT32, exit_layer.reshape(-1)),
               ("confidence", DTYPE_FLOAT32, confidence.reshape(-1))]
    left = (exit_layer < L).double().mean().item()
    with torch.no_grad():   # CALM's per-layer losses, every token through every layer
        _, full_loss, _, _, _, layer_losses = exit_forward(model, tokens, targets, case,
                                                           threshold, False)
    layer_losses[L - 1] = full_loss.item()
    arrays += [("layer_losses", DTYPE_FLOAT32, torch.tensor(layer_losses)),
               ("exit_weights", DTYPE_FLOAT64,
                torch.tensor(calm_weights(L, case["exit_from"]), dtype=torch.float64))]

    exits = []

    def step_loss(step):
        _, loss, exit_loss, exit_layer, _, _ = exit_forward(
            model, tokens, targets, case, threshold, step >= case["exit_warmup"], margins)
        exits.append(exit_layer.reshape(-1))
        return loss, loss + exit_loss

    lrs, losses, totals = train(model, tensors, CONFIG, step_loss)
    arrays += schedule_arrays(lrs, losses)
    arrays += [("train_totals", DTYPE_FLOAT32, torch.tensor(totals)),
               ("train_exits", DTYPE_INT32, torch.cat(exits))]
    return arrays, margins.smallest, left, losses


def candidate_thresholds(case):
    """Percentiles 30..95 of the initial model's confidences (every token
    through every layer), rounded to 4 digits and to float32."""
    model, tokens, targets, _ = build_model()
    with torch.no_grad():
        confidence = exit_forward(model, tokens, targets, case, 0.0, False)[4]
    values = confidence[~confidence.isnan()].sort().values
    picks = []
    for q in range(30, 96):
        value = values[int(q / 100 * (values.numel() - 1))].item()
        picks.append(as_float32(float(f"{value:.4g}")))
    return sorted(set(picks))


def choose_exit(case):
    """Among the thresholds that keep every decision DECISION_MARGIN from
    them and let between a fifth and 70% of the tokens leave in the first
    forward, the one under which tokens leave after the most blocks (two
    tokens or more each), then the one with the largest margin."""
    best, best_score = None, None
    L = CONFIG["layers"]
    for threshold in candidate_thresholds(case):
        arrays, margin, left, losses = build_exit(case, threshold)
        if margin < DECISION_MARGIN or not 0.2 <= left <= 0.7:
            continue
        exit_layer = dict((name, data) for name, _, data in arrays)["exit_layer"]
        counts = torch.bincount(exit_layer, minlength=L + 1)[:L]
        score = (int((counts >= 2).sum()), margin)
        if best is None or score > best_score:
            best, best_score = (arrays, margin, left, losses, threshold, counts), score
    if best is None:
        raise SystemExit(f"no threshold keeps every exit decision {DECISION_MARGIN} from it "
                         f"with a fifth to 70% of the tokens leaving: draw another model")
    return best


# ---- freezing ----------------------------------------------------------------------------

def freeze_forward(model, tokens, targets, prefix):
    """The loss with blocks [0, prefix) frozen with the embedding: they run
    without autograd."""
    B, T = tokens.shape
    with torch.set_grad_enabled(prefix == 0):
        x = model.wte(tokens) + model.wpe(torch.arange(T))
        for block in model.blocks[:prefix]:
            x = block(x)
    for block in model.blocks[prefix:]:
        x = block(x)
    logits = model.lnf(x) @ model.wte.weight.t()
    return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def build_freeze(case):
    model, tokens, targets, start = build_model()
    tensors = model.canonical_tensors()
    frozen_from = case["frozen_from"]
    optimizer = adamw(model, tensors)
    lrs, losses = [], []
    for step in range(CONFIG["steps"]):
        frozen = [0 <= f <= step for f in frozen_from]
        prefix = 0
        while prefix < len(frozen) and frozen[prefix]:
            prefix += 1
        for block, is_frozen in zip(model.blocks, frozen):
            for p in block.parameters():
                p.requires_grad_(not is_frozen)
        model.wpe.weight.requires_grad_(prefix == 0)
        lrs.append(set_lr(optimizer, step, CONFIG))
        optimizer.zero_grad(set_to_none=True)   # a frozen tensor's grad stays None
        loss = freeze_forward(model, tokens, targets, prefix)
        loss.backward()
        last_grads = flat([t.grad if t.grad is not None else torch.zeros_like(t)
                           for t in tensors])
        torch.nn.utils.clip_grad_norm_([t for t in tensors if t.grad is not None],
                                       HYPER["grad_clip"])
        optimizer.step()
        losses.append(loss.item())

    def moment(name):
        return flat([optimizer.state[t][name] if t in optimizer.state else torch.zeros_like(t)
                     for t in tensors])

    arrays = start + [("frozen_from", DTYPE_INT32, torch.tensor(frozen_from))]
    arrays += schedule_arrays(lrs, losses)
    arrays += [("last_grads", DTYPE_FLOAT32, last_grads),
              ("final_params", DTYPE_FLOAT32, flat(tensors)),
              ("final_m", DTYPE_FLOAT32, moment("exp_avg")),
              ("final_v", DTYPE_FLOAT32, moment("exp_avg_sq"))]
    return arrays, losses


# ---- the file ----------------------------------------------------------------------------

def fields(case, threshold):
    """Version 4's own header fields."""
    return (struct.pack("<4i", case["kind"], case.get("exit_from", 0),
                        case.get("confidence", 0), case.get("exit_warmup", 0)) +
            struct.pack("<2d", threshold, case.get("loss_weight", 0.0)))


def main():
    out_dir = output(__doc__)
    for name, case in CASES.items():
        path = os.path.join(out_dir, name)
        if case["kind"] == KIND_EXIT:
            arrays, margin, left, losses, threshold, counts = choose_exit(case)
            write_fixture(path, VERSION, CONFIG, fields(case, threshold), arrays)
            print(f"wrote {path} ({os.path.getsize(path)} bytes): threshold {threshold:.9g}; "
                  f"in the first forward {100 * left:.0f}% of the tokens leave, after blocks "
                  f"0.. {counts.tolist()}; smallest decision margin {margin:.3g}")
        else:
            arrays, losses = build_freeze(case)
            write_fixture(path, VERSION, CONFIG, fields(case, 0.0), arrays)
            print(f"wrote {path} ({os.path.getsize(path)} bytes)")
        print("  train losses: " + " ".join(f"{x:.6f}" for x in losses))


if __name__ == "__main__":
    main()
