#!/usr/bin/env bash
# Bad configuration: each gets exit status 2 and one message naming the
# problem (the key, the valid keys or the range).
set -u
. "$(dirname "$0")/lib.sh"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
printf '[model]\nlayers = 2\nchannels = 32\nheads = 2\n[train]\nbatch = 2\nseq = 16\nsteps = 1\nwarmup = 0\n[run]\nout_dir = %s/out\n' "$dir" > "$dir/ok.ini"
printf '[model]\nlayerz = 2\n' > "$dir/unknown.ini"
printf '[train]\nlr = 1e-3\ngrad_clip = 1e999\n' > "$dir/huge.ini"
printf '[modle]\nlayers = 2\n' > "$dir/section.ini"
printf '[model]\nlayers 2\n' > "$dir/syntax.ini"
# each section and each key once per file; an indented line is no continuation
printf '[model]\nlayers = 2\nchannels = 32\nlayers = 3\n' > "$dir/dupkey.ini"
printf '[model]\nlayers = 2\n[train]\nsteps = 1\n\n[model]\nheads = 2\n' > "$dir/dupsection.ini"
printf '[data]\ntrain = %s/a\n    /b.bin\n' "$dir" > "$dir/indent.ini"
printf 'layers = 2\n[model]\n' > "$dir/nosection.ini"
printf '[model] layers = 2\n' > "$dir/afterbracket.ini"
printf '[model]\nlayers = 2\nchannels = 32 ; a comment\nheads = 2  # another\nmax_seq = 16;not a comment\n' > "$dir/inline.ini"

expect_error "unknown key in file" "unknown key model.layerz.*valid keys of \[model\]: vocab, max_seq, layers" \
  "$DYNMO" train --config "$dir/unknown.ini"
expect_error "line number" "unknown.ini:2:" "$DYNMO" train --config "$dir/unknown.ini"
expect_error "unknown section" "unknown section \[modle\]" "$DYNMO" train --config "$dir/section.ini"
expect_error "syntax" "syntax.ini:2: syntax error" "$DYNMO" train --config "$dir/syntax.ini"
expect_error "duplicate key" "dupkey.ini:4: duplicate key model.layers: also set at $dir/dupkey.ini:2" \
  "$DYNMO" train --config "$dir/dupkey.ini"
expect_error "duplicate section" "dupsection.ini:6: duplicate section \[model\]: also at $dir/dupsection.ini:1" \
  "$DYNMO" train --config "$dir/dupsection.ini"
expect_error "indented line" "indent.ini:3: syntax error .*an indented line does not continue the one above" \
  "$DYNMO" train --config "$dir/indent.ini"
expect_error "key before a section" "nosection.ini:1: key 'layers' before any \[section\]" \
  "$DYNMO" train --config "$dir/nosection.ini"
expect_error "text after ]" "afterbracket.ini:1: syntax error: 'layers = 2' after '\]'" \
  "$DYNMO" train --config "$dir/afterbracket.ini"
expect_error "inline comments" "inline.ini:5: model.max_seq = '16;not a comment' is not an integer" \
  "$DYNMO" train --config "$dir/inline.ini"
expect_error "missing config" "cannot read config file $dir/nope.ini" "$DYNMO" train --config "$dir/nope.ini"
expect_error "unknown override key" "unknown key train.foo.*valid keys of \[train\]" \
  "$DYNMO" train --config "$dir/ok.ini" train.foo=1
expect_error "out of range" "model.layers = 0 is out of range \[1, 4096\]" \
  "$DYNMO" train --config "$dir/ok.ini" model.layers=0
expect_error "improvement out of range" "balance.min_improvement = 1 is out of range \[0, 0.99\]" \
  "$DYNMO" train --config "$dir/ok.ini" balance.min_improvement=1
expect_error "turns out of range" "parallel.turns = 2 is out of range \[0, 1\]" \
  "$DYNMO" train --config "$dir/ok.ini" parallel.turns=2
expect_error "not a number" "train.lr = 'fast' is not a number" \
  "$DYNMO" train --config "$dir/ok.ini" train.lr=fast
expect_error "negative seed" "train.seed = -1 is out of range \[0, 18446744073709551615\]" \
  "$DYNMO" train --config "$dir/ok.ini" train.seed=-1
# a number too large for its type is out of range, not "not a number"
expect_error "huge integer" "model.layers = 99999999999999999999 is out of range \[1, 4096\]" \
  "$DYNMO" train --config "$dir/ok.ini" model.layers=99999999999999999999
expect_error "huge seed" "train.seed = 99999999999999999999 is out of range \[0, 18446744073709551615\]" \
  "$DYNMO" train --config "$dir/ok.ini" train.seed=99999999999999999999
expect_error "huge number" "train.lr = 1e400 is out of range \[0, 10\] \(peak learning rate\)" \
  "$DYNMO" train --config "$dir/ok.ini" train.lr=1e400
expect_error "infinity" "train.lr = inf is out of range \[0, 10\]" \
  "$DYNMO" train --config "$dir/ok.ini" train.lr=inf
expect_error "range printed exactly" "train.beta2 = 1 is out of range \[0, 0.999999999\]" \
  "$DYNMO" train --config "$dir/ok.ini" train.beta2=1
expect_error "huge number in a file" "huge.ini:3: train.grad_clip = 1e999 is out of range \[0, 1e\+09\]" \
  "$DYNMO" train --config "$dir/huge.ini"
expect_error "nan" "train.lr = 'nan' is not a number" \
  "$DYNMO" train --config "$dir/ok.ini" train.lr=nan
expect_error "not an integer" "model.layers = '2.5' is not an integer" \
  "$DYNMO" train --config "$dir/ok.ini" model.layers=2.5
expect_error "seed not an integer" "train.seed = 'x' is not an integer" \
  "$DYNMO" train --config "$dir/ok.ini" train.seed=x
expect_error "heads divide channels" "model.heads = 3 does not divide model.channels = 32" \
  "$DYNMO" train --config "$dir/ok.ini" model.heads=3
expect_error "seq > max_seq" "train.seq = 300 exceeds model.max_seq = 256" \
  "$DYNMO" train --config "$dir/ok.ini" train.seq=300
expect_error "micro-batches" "train.micro_batches = 3 does not divide train.batch = 2" \
  "$DYNMO" train --config "$dir/ok.ini" train.micro_batches=3
# mixture of depths and hash attention (docs/mod-hash.md)
expect_error "MoD capacity 0" "model.mod_capacity = 0 is outside \(0, 1\]" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=2 model.mod_capacity=0
expect_error "MoD capacity 1.5" "model.mod_capacity = 1.5 is outside \(0, 1\]" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=2 model.mod_capacity=1.5
expect_error "MoD routing without MoD blocks" "\[mod\] is set \(mod.routing = causal, mod.predictor_hidden = 32\) but model.mod_every = 0" \
  "$DYNMO" train --config "$dir/ok.ini" mod.routing=causal
expect_error "MoD routing name" "mod.routing = 'sorted' must be topk or causal" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=1 mod.routing=sorted
expect_error "MoD predictor width 0" "mod.predictor_hidden = 0 is outside 1..65536" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=1 mod.routing=causal mod.predictor_hidden=0
expect_error "MoD predictor width too large" "mod.predictor_hidden = 70000 is outside 1..65536" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=1 mod.routing=causal mod.predictor_hidden=70000
expect_error "MoD predictor width with top-k" "mod.predictor_hidden = 16 is set but mod.routing = topk has no predictor" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=1 mod.predictor_hidden=16
expect_error "MoD predictor width not a number" "mod.predictor_hidden" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=1 mod.routing=causal mod.predictor_hidden=wide
# More buckets than a sequence has tokens is refused before anything is
# sized by it (10^9 buckets crashed in a stack array the size of the count).
expect_error "hash buckets 10^9" "hash.buckets = 1000000000 exceeds model.max_seq = 16" \
  "$DYNMO" train --config "$dir/ok.ini" model.max_seq=16 model.attention=hash hash.buckets=1000000000
expect_error "hash buckets 0" "hash.buckets = 0 must be 1 or an even number" \
  "$DYNMO" train --config "$dir/ok.ini" model.attention=hash hash.buckets=0
expect_error "hash buckets odd" "hash.buckets = 3 must be 1 or an even number" \
  "$DYNMO" train --config "$dir/ok.ini" model.attention=hash hash.buckets=3
expect_error "hash buckets on dense attention" "hash.buckets = 4 is set but model.attention = dense" \
  "$DYNMO" train --config "$dir/ok.ini" hash.buckets=4
expect_error "attention name" "model.attention = 'sparse' must be dense or hash" \
  "$DYNMO" train --config "$dir/ok.ini" model.attention=sparse
# A value just past a bound is printed as read, not rounded onto the bound.
expect_error "MoD capacity 1.0000001" "model.mod_capacity = 1.0000001 is outside \(0, 1\]" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=2 model.mod_capacity=1.0000001
expect_error "bias rate 1e-7 without the sigmoid router" "moe.bias_rate = 1e-07 needs moe.router = sigmoid" \
  "$DYNMO" train --config "$dir/ok.ini" model.moe_every=2 model.experts=4 moe.bias_rate=1e-7
expect_error "sparsity_initial just above sparsity_final" \
  "dyn.sparsity_initial = 0.90000001 is above dyn.sparsity_final = 0.9" \
  sh -c '"$1" prepare --out "$2/data" /usr/share/common-licenses/GPL-3 >/dev/null &&
         exec "$1" train --config "$2/ok.ini" data.train="$2/data/train.bin" dyn.kind=prune \
           dyn.sparsity_initial=0.90000001 dyn.sparsity_final=0.9' _ "$DYNMO" "$dir"
expect_error "MoD capacity negative" "model.mod_capacity = -0.25 is outside \(0, 1\]" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=2 model.mod_capacity=-0.25
expect_error "hash buckets negative" "hash.buckets = -2 must be 1 or an even number" \
  "$DYNMO" train --config "$dir/ok.ini" model.attention=hash hash.buckets=-2
expect_error "MoD with MoE" "model.moe_every = 2 with model.mod_every = 2: mixture of experts and mixture of depths do not combine yet; set model.moe_every = 0 or model.mod_every = 0" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=2 model.moe_every=2
expect_error "MoD with pruning" "model.mod_every = 2 with dyn.kind = prune: mixture of depths and pruning do not combine yet" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=2 dyn.kind=prune
expect_error "MoD with early exit" "model.mod_every = 2 with dyn.kind = early_exit: mixture of depths and early exit do not combine yet" \
  "$DYNMO" train --config "$dir/ok.ini" model.mod_every=2 dyn.kind=early_exit
expect_error "hash with early exit" "model.attention = hash with dyn.kind = early_exit: hash-sparse attention and early exit do not combine yet" \
  "$DYNMO" train --config "$dir/ok.ini" model.attention=hash dyn.kind=early_exit
expect_error "bad override form" "must look like section.key=value" \
  "$DYNMO" train --config "$dir/ok.ini" layers=3
expect_error "unknown argument" "unknown argument '--fast'" "$DYNMO" train --config "$dir/ok.ini" --fast
expect_error "missing data" "data/none.bin" "$DYNMO" train --config "$dir/ok.ini" data.train=data/none.bin
expect_error "unknown command" "unknown command 'trian'" "$DYNMO" trian
# no --config, or one that names no INI file: nothing trains, nothing is written
expect_error "no --config" "train: no --config FILE \(usage: dynmo train --config FILE" \
  "$DYNMO" train run.out_dir="$dir/out" train.steps=1
expect_error "no --config (bench)" "bench: no --config FILE \(usage: dynmo bench --config FILE" \
  "$DYNMO" bench run.out_dir="$dir/out"
expect_error "--config twice" "--config given twice \($dir/ok.ini, $dir/unknown.ini\)" \
  "$DYNMO" train --config "$dir/ok.ini" --config "$dir/unknown.ini"
expect_error "--config a directory" "config file $dir is a directory, not a regular file" \
  "$DYNMO" train --config "$dir"
mkfifo "$dir/fifo.ini"
expect_error "--config a FIFO" "config file $dir/fifo.ini is a FIFO, not a regular file" \
  timeout -k 5 30 "$DYNMO" train --config "$dir/fifo.ini"
# on 3 ranks a missing token file is one message, not one per rank
out=$(timeout -k 10 60 mpiexec -n 3 "$DYNMO" train --config "$dir/ok.ini" data.train=data/none.bin 2>&1)
rc=$?
n=$(grep -c 'cannot open token file' <<<"$out")
[ $rc -eq 2 ] && [ "$n" -eq 1 ] && echo "ok: 3 ranks, missing data: one message, exit 2" \
  || fail "3 ranks, missing data: exit $rc, $n messages: $out"
[ ! -e "$dir/out/runlog.h5" ] || fail "a failed start left a run log behind"
finish
