#!/usr/bin/env bash
# balance.units = sublayer (docs/balance.md): a block's attention and its
# MLP as separate units of placement. Layouts count units: bad layouts and
# stage counts exit 2 with one message naming the units.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
need_dynmo
work_dir
tiny_config "$dir/tiny.ini" model.layers=5

bad() { train_refused "$1" "$2" "$3" "$dir/tiny.ini" "${@:4}"; }
bad "units name" "balance.units = 'layer' must be block or sublayer" 1 balance.units=layer
bad "explicit not the unit count" \
  "covers 11 units but the 10 units of model.layers = 5 with balance.units = sublayer" 3 \
  parallel.pp=3 balance.units=sublayer balance.initial=explicit:3,4,4
bad "explicit counts blocks under units=block" "covers 10 blocks but model.layers = 5" 3 \
  parallel.pp=3 balance.initial=explicit:3,4,3
bad "more stages than units" "parallel.pp = 11 exceeds the 10 units of model.layers = 5" 11 \
  parallel.pp=11 balance.units=sublayer
finish
