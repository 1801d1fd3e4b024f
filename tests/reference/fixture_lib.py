"""What the PyTorch fixture generators of this directory share (make_fixture.py,
make_moe_fixture.py, make_mod_hash_model_fixture.py, make_exit_fixture.py):
the DMREF file format, the optimizer's hyperparameters and learning-rate
schedule, the draw of a model's weights and batch, the GPT around its blocks
(embeddings, final LayerNorm, the LM head tied to wte, the canonical flat
order and which tensors are decayed), AdamW and the training loop, and the
generators' command line. Like the generators, it imports nothing of dynmo:
it is written from the format and the model that tests/reference/README.md
and include/dynmo/model.h describe. It computes nothing a test checks by
itself; each generator says what its model does.

The DMREF format (little-endian; tests/fixture.h reads it):

    offset  type          field
    0       char[8]       magic "DMREF00<version>"
    8       uint32        version (1 dense, 2 MoE, 3 MoD or hash, 4 exit or freeze)
    12      int32[9]      vocab, max_seq, layers, heads, channels,
                          batch, seq, steps, warmup
    48      float64[7]    lr, min_lr_ratio, beta1, beta2, eps,
                          weight_decay, grad_clip
    104     the version's own fields (none in version 1)
            uint32        number of arrays that follow
            arrays, each:
              char[16]    name, NUL-padded ASCII
              uint32      dtype: 0 = float32, 1 = int32, 2 = float64
              int32       count (elements)
              count * 4 (or 8 for float64) bytes of data
"""

import argparse
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE_FLOAT32, DTYPE_INT32, DTYPE_FLOAT64 = 0, 1, 2

# Every fixture's optimizer: AdamW with clipping to a global L2 norm.
HYPER = dict(lr=1e-3, min_lr_ratio=0.1, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, grad_clip=1.0)

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- the file ------------------------------------------------------------------------------

def config_header(version, config, hyper=HYPER):
    """The 104 bytes every fixture starts with: magic, version, the model
    and run sizes, the optimizer's hyperparameters."""
    header = b"DMREF%03d" % version + struct.pack("<I", version)
    header += struct.pack("<9i", *(config[k] for k in
                                   ("vocab", "max_seq", "layers", "heads", "channels",
                                    "batch", "seq", "steps", "warmup")))
    header += struct.pack("<7d", *(hyper[k] for k in
                                   ("lr", "min_lr_ratio", "beta1", "beta2", "eps",
                                    "weight_decay", "grad_clip")))
    assert len(header) == 104
    return header


def write_fixture(path, version, config, fields, arrays):
    """Writes a fixture to path atomically: the header of config, the
    version's own fields (bytes), the array count, then each (name, dtype,
    tensor) record, the tensor converted to the dtype."""
    formats = {DTYPE_FLOAT32: ("<f4", torch.float32), DTYPE_INT32: ("<i4", torch.int32),
               DTYPE_FLOAT64: ("<f8", torch.float64)}
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(config_header(version, config) + fields + struct.pack("<I", len(arrays)))
        for name, dtype, data in arrays:
            numpy_format, torch_type = formats[dtype]
            values = data.to(torch_type).contiguous().numpy().astype(numpy_format)
            f.write(struct.pack("<16sIi", name.encode("ascii"), dtype, values.size))
            f.write(values.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def batch_arrays(tensors, tokens, targets):
    """The arrays every fixture opens with: the initial parameters in the
    canonical flat order and the batch, (B, T) row-major."""
    return [("params", DTYPE_FLOAT32, flat(tensors)),
            ("tokens", DTYPE_INT32, tokens.reshape(-1)),
            ("targets", DTYPE_INT32, targets.reshape(-1))]


def output_arrays(logits, loss):
    """The logits (B, T, V) and the mean cross-entropy of one forward."""
    return [("logits", DTYPE_FLOAT32, logits.detach().reshape(-1)),
            ("loss", DTYPE_FLOAT32, loss.detach().reshape(1))]


def grad_arrays(tensors, name="grads"):
    """The gradient of every tensor, in the canonical flat order."""
    return [(name, DTYPE_FLOAT32, flat([t.grad for t in tensors]))]


def schedule_arrays(lrs, losses):
    """The learning rate of each step and the loss before its update."""
    return [("lrs", DTYPE_FLOAT64, torch.tensor(lrs, dtype=torch.float64)),
            ("train_losses", DTYPE_FLOAT32, torch.tensor(losses, dtype=torch.float32))]


# ---- the model -----------------------------------------------------------------------------

def init_weights(model, generator):
    """Perturbs what torch's module init leaves trivial: embeddings
    N(0, 0.3^2), LayerNorm weights 1 + N(0, 0.1^2) and biases N(0, 0.1^2)."""
    with torch.no_grad():
        for embedding in (model.wte, model.wpe):
            embedding.weight.copy_(torch.randn(embedding.weight.shape, generator=generator) * 0.3)
        norms = [model.lnf] + [n for b in model.blocks for n in (b.ln1, b.ln2)]
        for norm in norms:
            norm.weight.copy_(1.0 + 0.1 * torch.randn(norm.weight.shape, generator=generator))
            norm.bias.copy_(0.1 * torch.randn(norm.bias.shape, generator=generator))


def draw(seed, config, make_model, init=init_weights):
    """A fixture's model and batch: torch's global generator and a private
    one both seeded with seed; make_model() builds the model (nn.Linear's
    own uniform init draws from the global one), init(model, generator)
    perturbs it, then tokens and targets (B, T) come from the generator.
    Returns the model, its tensors in the canonical flat order, tokens,
    targets."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = make_model()
    init(model, generator)
    tensors = model.canonical_tensors()
    assert len(tensors) == len(list(model.parameters()))
    shape = (config["batch"], config["seq"])
    tokens = torch.randint(0, config["vocab"], shape, generator=generator)
    targets = torch.randint(0, config["vocab"], shape, generator=generator)
    return model, tensors, tokens, targets


class GPTBase(nn.Module):
    """The GPT around its blocks: token and learned position embeddings,
    the blocks, a final LayerNorm (eps 1e-5) and an LM head tied to wte,
    mean cross-entropy over the B*T tokens. make_block(l) builds block l;
    a block lists its tensors in dynmo's block order (canonical_tensors)
    and its decayed matrices (matrices). forward expects each block to
    return its output and a loss it adds (0.0 if none), and returns the
    logits, the cross-entropy and the blocks' added losses."""

    def __init__(self, config, make_block):
        super().__init__()
        self.wte = nn.Embedding(config["vocab"], config["channels"])
        self.wpe = nn.Embedding(config["max_seq"], config["channels"])
        self.blocks = nn.ModuleList(make_block(l) for l in range(config["layers"]))
        self.lnf = nn.LayerNorm(config["channels"], eps=1e-5)

    def embed(self, tokens):
        return self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))

    def head(self, x, targets):
        B, T = targets.shape
        logits = self.lnf(x) @ self.wte.weight.t()
        return logits, F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        added = 0.0
        for block in self.blocks:
            x, a = block(x)
            added = added + a
        logits, loss = self.head(x, targets)
        return logits, loss, added

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


class Margins:
    """The smallest gap seen between a decision's two sides (a number, or
    a tensor of gaps, possibly empty)."""
    def __init__(self):
        self.smallest = math.inf

    def see(self, gaps):
        if torch.is_tensor(gaps):
            if gaps.numel() == 0:
                return
            gaps = gaps.min()
        self.smallest = min(self.smallest, float(gaps))


# ---- training ------------------------------------------------------------------------------

def lr_at_step(step, lr, min_lr_ratio, warmup, steps):
    """dynmo's lr_at_step: linear warm-up, then cosine down to lr * min_lr_ratio."""
    if step < warmup:
        return lr * (step + 1) / warmup
    ratio = (step - warmup) / max(1, steps - warmup)
    min_lr = lr * min_lr_ratio
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def adamw(model, tensors, hyper=HYPER):
    """torch.optim.AdamW over tensors, weight decay on model.decayed() only."""
    decayed_ids = {id(t) for t in model.decayed()}
    groups = [{"params": [t for t in tensors if id(t) in decayed_ids],
               "weight_decay": hyper["weight_decay"]},
              {"params": [t for t in tensors if id(t) not in decayed_ids],
               "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=hyper["lr"], betas=(hyper["beta1"], hyper["beta2"]),
                             eps=hyper["eps"])


def set_lr(optimizer, step, config, hyper=HYPER):
    """Sets step's learning rate (0-based) on every group; returns it."""
    lr = lr_at_step(step, hyper["lr"], hyper["min_lr_ratio"], config["warmup"], config["steps"])
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def train(model, tensors, config, step_loss, after_step=None, hyper=HYPER):
    """config["steps"] steps on the same batch, each: its learning rate,
    the gradients zeroed, step_loss(step) (the forward: the loss to record
    and the loss to train, a tensor), the backward of the latter, clipping
    to the global norm grad_clip (torch.nn.utils.clip_grad_norm_), AdamW,
    then after_step() if given. Returns the learning rates, the recorded
    losses and the trained ones, each as floats by step."""
    optimizer = adamw(model, tensors, hyper)
    lrs, losses, totals = [], [], []
    for step in range(config["steps"]):
        lrs.append(set_lr(optimizer, step, config, hyper))
        optimizer.zero_grad(set_to_none=False)
        loss, total = step_loss(step)
        total.backward()
        torch.nn.utils.clip_grad_norm_(tensors, hyper["grad_clip"])
        optimizer.step()
        if after_step is not None:
            after_step()
        losses.append(loss.item())
        totals.append(total.item())
    return lrs, losses, totals


# ---- the command line ----------------------------------------------------------------------

def output(doc, option="--out-dir", default=HERE):
    """The generator's one option (where to write, default this
    directory), with its docstring's first line as the description; torch
    then runs on one thread, so that its sums have one order."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument(option, default=default)
    where = getattr(parser.parse_args(), option.lstrip("-").replace("-", "_"))
    torch.set_num_threads(1)
    return where
