"""Writes the token fixtures of tests/data/tokens (tests/README.md) with the
formats' own writers, so that dynmo's readers are tested against files it
did not write itself:

- gpt2_megatron.{bin,idx}, llama3_megatron.{bin,idx}: megatron-core's
  IndexedDatasetBuilder (uint16 and int32 tokens, the dtypes its
  DType.optimal_dtype picks for GPT-2's 50,257 and Llama 3's 128,256 ids).
- gpt2_llmc.bin, llama3_llmc.bin: llm.c token shards. llm.c's writer is a
  few lines of numpy (dev/data/data_common.py, write_datafile: a header of
  256 int32, magic 20240520 version 1 with uint16 tokens or magic 20240801
  version 7 with uint32 tokens, the token count, then the tokens); this
  script writes the same bytes with numpy, it does not import llm.c.
- gpt2_dynmo.bin: the same ids as a dynmo token file (docs/data.md), for the
  tests that want the same stream in all three formats.

Each pair holds the same documents (token ids drawn from a fixed seed):
the Megatron files as documents (some of two sequences, as
preprocess_data.py's sentence splitting makes), the llm.c and dynmo files
as the documents concatenated. Deterministic: a rerun gives the same bytes.

Run with a Python that has numpy, torch and megatron-core:

    /usr/bin/python3 -m venv --system-site-packages /work/venv-fixtures   # Debian's torch, numpy
    /work/venv-fixtures/bin/pip install --no-deps megatron-core packaging
    /work/venv-fixtures/bin/python tests/data/tokens/make_fixtures.py --out-dir DIR

megatron-core 0.16's package __init__ imports parts that need a newer torch
than Debian's 1.13; the dataset module itself does not, so this script
registers the `megatron` and `megatron.core` packages without running
their __init__ and imports megatron.core.datasets.indexed_dataset from the
installed package as it is.
"""
import argparse
import importlib.util
import os
import sys
import types

import numpy as np
import torch


def import_indexed_dataset():
    spec = importlib.util.find_spec("megatron")
    if spec is None:
        sys.exit("megatron-core is not installed (pip install --no-deps megatron-core)")
    root = spec.submodule_search_locations[0]
    for name, path in (("megatron", root), ("megatron.core", os.path.join(root, "core"))):
        module = types.ModuleType(name)
        module.__path__ = [path]
        sys.modules[name] = module
    import megatron.core.parallel_state  # noqa: F401  (megatron.core.utils needs it first)
    from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def documents(seed, vocab, count):
    """count documents of 20 to 160 ids below vocab; a few ids near the top."""
    rng = np.random.RandomState(seed)
    docs = []
    for d in range(count):
        n = int(rng.randint(20, 161))
        ids = rng.randint(0, vocab, size=n).astype(np.int64)
        ids[0] = vocab - 1 - d  # the largest ids, so a narrower type would not hold them
        docs.append(ids)
    return docs


def write_megatron(indexed_dataset, prefix, docs, dtype):
    builder = indexed_dataset.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for d, ids in enumerate(docs):
        if d % 3 == 1:  # two sequences ("sentences") in one document
            cut = len(ids) // 2
            builder.add_document(torch.from_numpy(ids), [cut, len(ids) - cut])
        else:
            builder.add_document(torch.from_numpy(ids), [len(ids)])
    builder.finalize(prefix + ".idx")


def write_llmc(path, ids, magic, version, dtype):
    header = np.zeros(256, dtype=np.int32)
    header[0] = magic
    header[1] = version
    header[2] = len(ids)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(ids, dtype=dtype).tobytes())


def write_dynmo(path, ids, vocab):
    tokens = np.asarray(ids, dtype="<u2").tobytes()
    checksum = 0xCBF29CE484222325
    for b in tokens:
        checksum = ((checksum ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    header = bytearray(64)
    header[0:8] = b"DYNMOTOK"
    header[8:12] = (1).to_bytes(4, "little")
    header[12:16] = vocab.to_bytes(4, "little")
    header[16:20] = (2).to_bytes(4, "little")
    header[24:32] = (len(ids)).to_bytes(8, "little")
    header[32:40] = checksum.to_bytes(8, "little")
    with open(path, "wb") as f:
        f.write(bytes(header))
        f.write(tokens)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    out = parser.parse_args().out_dir
    os.makedirs(out, exist_ok=True)
    indexed_dataset = import_indexed_dataset()
    DType = indexed_dataset.DType

    gpt2 = documents(20240520, 50257, 12)
    assert DType.optimal_dtype(50257) == np.uint16
    write_megatron(indexed_dataset, os.path.join(out, "gpt2_megatron"), gpt2, np.uint16)
    stream = np.concatenate(gpt2)
    write_llmc(os.path.join(out, "gpt2_llmc.bin"), stream, 20240520, 1, np.uint16)
    write_dynmo(os.path.join(out, "gpt2_dynmo.bin"), stream, 50257)

    llama3 = documents(20240801, 128256, 8)
    assert DType.optimal_dtype(128256) == np.int32
    write_megatron(indexed_dataset, os.path.join(out, "llama3_megatron"), llama3, np.int32)
    write_llmc(os.path.join(out, "llama3_llmc.bin"), np.concatenate(llama3), 20240801, 7,
               np.uint32)

    # read back through megatron-core's own reader: the documents as written
    for name, docs in (("gpt2_megatron", gpt2), ("llama3_megatron", llama3)):
        dataset = indexed_dataset.IndexedDataset(os.path.join(out, name))
        got = np.concatenate([dataset[i] for i in range(len(dataset))])
        assert np.array_equal(got, np.concatenate(docs)), name
        assert len(dataset.document_indices) == len(docs) + 1, name
    for name in sorted(os.listdir(out)):
        print(f"{name}: {os.path.getsize(os.path.join(out, name))} bytes")


if __name__ == "__main__":
    main()
