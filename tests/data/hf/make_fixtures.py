"""Writes the Hugging Face fixtures of tests/data/hf (tests/README.md) with
transformers itself, so that `dynmo import-hf`, `export-hf` and `eval` are
tested against files and numbers dynmo did not make:

- gpt2-tiny/: a random GPT-2 (2 layers of 32 channels, 4 heads, vocab 96,
  32 positions; every parameter, layer norms and biases included, moved
  off its initial value by noise so that none is a constant) saved by
  GPT2LMHeadModel.save_pretrained(..., safe_serialization=True):
  config.json, generation_config.json, model.safetensors (float32).
- tokens.bin: 400 token ids below 96 as an llm.c token shard (a header of
  256 int32: magic 20240520, version 1, the count; then uint16 ids).
- losses.txt: transformers' mean next-token cross-entropy of that model
  over tokens.bin cut into windows of T + 1 tokens, T apart, from token 0
  (every whole window), for T = 32 and T = 7, one line each:
  `seq T windows W tokens N loss X`.

With --dynmo PATH (a built dynmo) it also checks the way back, which the
tests cannot do without transformers: import-hf, then export-hf, then
GPT2LMHeadModel.from_pretrained on the exported directory must give the
same losses within 1e-4 (relative), and dynmo eval on the imported
checkpoint too.

Deterministic: a rerun gives the same bytes. Run with a Python that has
torch, numpy, transformers and safetensors:

    /usr/bin/python3 -m venv --system-site-packages /work/venv-fixtures   # Debian's torch 1.13, numpy
    /work/venv-fixtures/bin/pip install --no-deps transformers==4.36.2 safetensors==0.4.1 \
        huggingface_hub==0.20.3 tokenizers==0.15.0 regex tqdm filelock fsspec
    /work/venv-fixtures/bin/python tests/data/hf/make_fixtures.py --out-dir DIR [--dynmo build/dynmo]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, POSITIONS, EMBD, LAYERS, HEADS = 96, 32, 32, 2, 4
TOKENS = 400
SEQS = (32, 7)
TOLERANCE = 1e-4


def make_model():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=EMBD, n_layer=LAYERS,
                        n_head=HEADS, initializer_range=0.1, bos_token_id=VOCAB - 1,
                        eos_token_id=VOCAB - 1)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.05 * torch.randn(p.shape))
    return model.eval()


def tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (TOKENS,), generator=g).numpy().astype(np.uint16)


def write_llmc(path, ids):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(ids.astype("<u2").tobytes())


def mean_loss(model, ids, T):
    """Mean cross-entropy of every whole window of T + 1 tokens, T apart."""
    windows = (len(ids) - 1) // T
    x = torch.tensor(np.stack([ids[w * T: w * T + T + 1] for w in range(windows)]).astype(np.int64))
    with torch.no_grad():
        logits = model(x[:, :-1]).logits
        losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                                                   reduction="none")
    return windows, windows * T, float(losses.double().mean())


def check_round_trip(dynmo, out_dir, ids, expected):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "gpt2-tiny.h5")
        exported = os.path.join(tmp, "exported")
        subprocess.run([dynmo, "import-hf", os.path.join(out_dir, "gpt2-tiny"), "--out", ckpt],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([dynmo, "export-hf", ckpt, "--out", exported], check=True,
                       stdout=subprocess.DEVNULL)
        model = GPT2LMHeadModel.from_pretrained(exported).eval()
        for T, (_, _, loss) in expected.items():
            got = mean_loss(model, ids, T)[2]
            diff = abs(got - loss) / loss
            print(f"export -> transformers, seq {T}: {got:.7f} vs {loss:.7f} (rel. diff {diff:.1e})")
            assert diff <= TOLERANCE, "exported model's loss differs"
            out = subprocess.run([dynmo, "eval", "--checkpoint", ckpt, "--data",
                                  os.path.join(out_dir, "tokens.bin"), "--seq", str(T)],
                                 check=True, capture_output=True, text=True).stdout
            got = float(re.search(r"^loss: (\S+)", out, re.M).group(1))
            diff = abs(got - loss) / loss
            print(f"dynmo eval, seq {T}: {got:.7f} vs {loss:.7f} (rel. diff {diff:.1e})")
            assert diff <= TOLERANCE, "dynmo eval's loss differs"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--dynmo", help="a built dynmo: check import, export and eval too")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    model = make_model()
    model.save_pretrained(os.path.join(args.out_dir, "gpt2-tiny"), safe_serialization=True)
    ids = tokens()
    write_llmc(os.path.join(args.out_dir, "tokens.bin"), ids)
    expected = {T: mean_loss(model, ids, T) for T in SEQS}
    with open(os.path.join(args.out_dir, "losses.txt"), "w") as f:
        for T, (windows, n, loss) in expected.items():
            f.write(f"seq {T} windows {windows} tokens {n} loss {loss:.9f}\n")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: wrote "
          f"{args.out_dir}")
    if args.dynmo:
        check_round_trip(args.dynmo, args.out_dir, ids, expected)


if __name__ == "__main__":
    sys.exit(main())
