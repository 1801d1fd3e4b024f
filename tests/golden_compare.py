#!/usr/bin/env python3
"""Compares a run's golden record (golden_record.py's output) with the kept
one, in one of two ways, and checks itself.

    golden_compare.py bits WANT HAVE     every row identical, loss bits included
    golden_compare.py near WANT HAVE     the same rows, step numbers and layouts;
                                         each loss within 1e-3 relative of the
                                         kept one; a filler row (NaN: a step
                                         before a resume) only against the same
                                         filler bits
    golden_compare.py self-test RECORD...
                                         both comparisons on altered copies of
                                         the given records: each alteration
                                         must be caught by the comparison that
                                         should catch it and let through by the
                                         one that should not

`bits` is the check where the records were made on the same OpenBLAS core;
`near` is the check for another core's kernels (other summation orders).
t_golden.sh runs `near` on every machine and `bits` where the cores agree,
and the self-test everywhere, so neither branch can only pass (or only run)
on the machine the records come from. Exit 0 when the comparison holds,
1 with the first difference on stderr otherwise."""
import math
import struct
import sys

TOLERANCE = 1e-3


class Mismatch(Exception):
    pass


def parse(lines):
    """Rows as tuples: ("step"|"eval", number, loss bits, loss value, layout)
    for loss rows, the split words for any other row."""
    rows = []
    for n, line in enumerate(lines, 1):
        w = line.split()
        if not w:
            continue
        if w[0] in ("step", "eval"):
            if len(w) < 5 or w[2] != "loss":
                raise Mismatch(f"line {n}: not a loss row: {line.strip()}")
            bits = int(w[3], 16)
            value = struct.unpack("<f", struct.pack("<I", bits))[0]
            layout = w[6] if len(w) > 6 and w[5] == "layout" else ""
            rows.append((w[0], w[1], bits, value, layout))
        else:
            rows.append(tuple(w))
    return rows


def key(row):
    """A row without its loss as a float (NaN is unequal to itself; the bits
    say it all)."""
    return row[:3] + row[4:] if row[0] in ("step", "eval") else row


def compare(mode, want_lines, have_lines):
    """Raises Mismatch naming the first row that differs."""
    want, have = parse(want_lines), parse(have_lines)
    if len(want) != len(have):
        raise Mismatch(f"{len(have)} rows where the record has {len(want)}")
    for x, y in zip(want, have):
        if x[0] not in ("step", "eval") or mode == "bits":
            if key(x) != key(y):
                raise Mismatch(f"{y} where the record has {x}")
            continue
        if x[:2] != y[:2] or x[4] != y[4]:
            raise Mismatch(f"{y[0]} {y[1]} layout {y[4]} where the record has "
                           f"{x[0]} {x[1]} layout {x[4]}")
        a, b = x[3], y[3]
        if math.isnan(a) or math.isnan(b):
            if x[2] != y[2]:   # a filler row matches only the same filler
                raise Mismatch(f"{y[0]} {y[1]}: loss {y[2]:08x} ({b}) where the record "
                               f"has {x[2]:08x} ({a})")
        elif not abs(a - b) <= TOLERANCE * abs(a):
            raise Mismatch(f"{y[0]} {y[1]}: loss {b} where the record has {a} "
                           f"(relative difference {abs(a - b) / abs(a):.2e} > {TOLERANCE})")


def holds(mode, want, have):
    try:
        compare(mode, want, have)
        return True
    except Mismatch:
        return False


def with_loss(line, value=None, bits=None):
    w = line.split()
    if bits is None:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
    value = struct.unpack("<f", struct.pack("<I", bits))[0]
    w[3], w[4] = f"{bits:08x}", f"({value:.6f})"
    return " ".join(w) + "\n"


def alterations(lines):
    """(what, altered lines, caught by bits, caught by near) for one record."""
    rows = parse(lines)
    loss_rows = [i for i, r in enumerate(rows) if r[0] in ("step", "eval")]
    real = [i for i in loss_rows if not math.isnan(rows[i][3]) and rows[i][3] != 0]
    filler = [i for i in loss_rows if math.isnan(rows[i][3])]
    index = [i for i, line in enumerate(lines) if line.split()]   # row -> line
    out = [("unchanged", list(lines), False, False)]
    if real:
        i = index[real[-1]]
        v, b = rows[real[-1]][3], rows[real[-1]][2]
        out.append(("last mantissa bit", lines[:i] + [with_loss(lines[i], bits=b ^ 1)] + lines[i + 1:],
                    True, False))
        out.append(("loss x (1 + 5e-4)", lines[:i] + [with_loss(lines[i], value=v * (1 + 5e-4))] +
                    lines[i + 1:], True, False))
        out.append(("loss x (1 + 2e-3)", lines[:i] + [with_loss(lines[i], value=v * (1 + 2e-3))] +
                    lines[i + 1:], True, True))
        out.append(("loss made NaN", lines[:i] + [with_loss(lines[i], bits=0x7FC00000)] +
                    lines[i + 1:], True, True))
    if filler:
        i = index[filler[0]]
        out.append(("filler made a number", lines[:i] + [with_loss(lines[i], value=2.5)] +
                    lines[i + 1:], True, True))
        out.append(("filler NaN's bits", lines[:i] + [with_loss(lines[i], bits=0x7FC00001)] +
                    lines[i + 1:], True, True))
    with_layout = [i for i in loss_rows if rows[i][4]]
    if with_layout:
        i = index[with_layout[0]]
        w = lines[i].split()
        parts = w[6].split(",")
        if len(parts) > 1:
            parts[0], parts[1] = str(int(parts[0]) + 1), str(int(parts[1]) - 1)
        else:
            parts[0] = str(int(parts[0]) + 1)
        w[6] = ",".join(parts)
        out.append(("layout moved", lines[:i] + [" ".join(w) + "\n"] + lines[i + 1:], True, True))
    if loss_rows:
        i = index[loss_rows[-1]]
        out.append(("last row dropped", lines[:i] + lines[i + 1:], True, True))
    return out


def self_test(paths):
    """Every alteration of every record caught or let through as it should;
    returns the number of checks made, raises Mismatch on the first wrong
    verdict. At least one record must hold filler rows, so the NaN branch is
    exercised wherever this runs."""
    checks, filler_seen = 0, False
    for path in paths:
        lines = open(path).readlines()
        filler_seen |= any(r[0] == "step" and math.isnan(r[3]) for r in parse(lines))
        for what, altered, by_bits, by_near in alterations(lines):
            for mode, caught in (("bits", by_bits), ("near", by_near)):
                if holds(mode, lines, altered) == caught:
                    raise Mismatch(f"{path}: {what}: the {mode} comparison "
                                   f"{'let it through' if caught else 'refused it'}")
                checks += 1
    if not filler_seen:
        raise Mismatch("no record with filler rows: the NaN branch went unchecked")
    return checks


def main(argv):
    if len(argv) >= 2 and argv[1] == "self-test":
        try:
            n = self_test(argv[2:])
        except Mismatch as e:
            print(f"golden_compare self-test: {e}", file=sys.stderr)
            return 1
        print(f"golden_compare self-test: {n} verdicts on {len(argv) - 2} records as expected")
        return 0
    if len(argv) != 4 or argv[1] not in ("bits", "near"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        compare(argv[1], open(argv[2]).readlines(), open(argv[3]).readlines())
    except Mismatch as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
