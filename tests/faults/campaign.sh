#!/usr/bin/env bash
# The fault campaign (issue 15): `make check-faults [TRIALS=N] [SEED=S]`, not
# part of `make check`. A run must never be lost to a crash:
#
#  - kill trials (TRIALS, default 20): a 4-rank run of a tiny GPT on the
#    GPL text (pp=4 and pp=2 x dp=2 in turn) checkpointing every 2 or 3
#    steps (ckpt.keep=2) gets SIGKILL on one random rank, either while a
#    checkpoint is being written (the k-th ckpt-N.h5.tmp seen, then 0-5
#    ms) or at a random moment (start-up, or 0-50 ms after a random step).
#    The job must end (mpiexec returns, no process of it left), every
#    complete checkpoint must pass `dynmo check-ckpt` and `latest` must name
#    one no older than the last "checkpoint:" line; resumed with
#    ckpt.resume=auto on the same world or on 2 ranks (the same dp, which
#    fixes the bits: docs/pipeline.md), the chained run's losses must equal
#    the uninterrupted run's bit for bit;
#  - full-disk trials: ckpt.dir (or run.out_dir) on a small tmpfs, too small
#    for one checkpoint, for three, full from the start, or filled up
#    during the run: exit 2 (or
#    1, the documented fatal path of a failure inside HDF5: include/dynmo/
#    ckpt.h) with one line on stderr naming "No space left" and the path;
#    no half-written checkpoint taken for complete; resumed after space is
#    freed, bit-identical;
#  - read-only trials: ckpt.dir a read-only tmpfs, ckpt.dir a read-only bind
#    mount holding checkpoints, run.out_dir on a read-only tmpfs: exit 2
#    with one line naming the path and the read-only file system (whether
#    it came before the first step is said, not required).
#
# One line per trial, then the summary line; exit 1 if any trial failed.
# SEED repeats the campaign's choices (the timing of each run is the
# machine's). Mounts need root: without it, or when mount fails, those
# trials are skipped and say so. Everything mounted is unmounted and every
# process started is ended on exit; the work directory is kept only when a
# trial failed.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
DYNMO=${DYNMO:-$PWD/$BUILD/dynmo}
TRIALS=${TRIALS:-20}
SEED=${SEED:-$(( $(date +%s) % 32768 ))}
if ! [[ $TRIALS =~ ^[0-9]+$ && $SEED =~ ^[0-9]+$ ]]; then
  echo "faults: TRIALS and SEED must be non-negative integers (TRIALS=$TRIALS SEED=$SEED)" >&2; exit 2
fi
if [ ! -x "$DYNMO" ]; then echo "faults: build $DYNMO first (make all)" >&2; exit 2; fi
RANDOM=$SEED
. tests/faults/lib.sh
WORK=$(mktemp -d /tmp/dynmo-faults.XXXXXX)
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

STEPS=24        # steps of every run; a 4-rank run takes 2-5 s on 2 shared cores
KEEP=2          # ckpt.keep
dir=$WORK; . tests/lib.sh   # tiny_config (6 blocks of 32 channels) on $dir/data
"$DYNMO" prepare --out "$WORK/data" /usr/share/common-licenses/GPL-3 >/dev/null \
  || { echo "faults: dynmo prepare failed" >&2; exit 1; }
tiny_config "$WORK/t.ini" train.steps=$STEPS
echo "faults: seed $SEED (repeat with SEED=$SEED), $TRIALS kill trials, $STEPS steps per run, work in $WORK"

# train RANKS PP DP OUT_DIR CKPT_DIR [key=value...]: the command of one run
# (no ckpt.dir when CKPT_DIR is -).
train() {
  local ranks=$1 pp=$2 dp=$3 out=$4 ck=$5; shift 5
  CMD=(mpiexec -n "$ranks" "$DYNMO" train --config "$WORK/t.ini" parallel.pp="$pp" parallel.dp="$dp"
       run.out_dir="$out")
  [ "$ck" != - ] && CMD+=(ckpt.dir="$ck" ckpt.keep=$KEEP)
  CMD+=("$@")
}
# resumed_step OUT: the step the run of OUT resumed from, 0 for a fresh start.
resumed_step() {
  local s; s=$(grep -o 'resumed from .* at step [0-9]*' "$1" | grep -o '[0-9]*$')
  echo "${s:-0}"
}
say_problems() {   # the failed trial's details, indented
  local p; for p in "${PROBLEMS[@]}"; do echo "    - $p"; done
}

# ---- references: the uninterrupted runs ----------------------------------------
# One per data-parallel width (dp=2 sums two partial gradients, so its bits
# differ from dp=1: docs/pipeline.md); saving checkpoints must not change them.
trial_dir=$WORK/reference; mkdir -p "$trial_dir"
premise() { echo "faults: $1"; echo "faults: the campaign cannot run; files in $WORK"; KEEP_WORK=1; exit 1; }
declare -A REF
reference() {   # NAME RANKS PP DP CKPT_DIR [key=value...]
  local name=$1 ranks=$2 pp=$3 dp=$4 ck=$5; shift 5
  train "$ranks" "$pp" "$dp" "$trial_dir/$name" "$ck" "$@"
  job_start "$name" "${CMD[@]}"; job_wait 300
  [ $JOB_RC -eq 0 ] || premise "reference run $name exited $JOB_RC: $(tail -n 3 "$JOB_ERR")"
}
reference ref-dp1 1 1 1 -
h5dump -b LE -d /steps/loss -o "$trial_dir/dp1.loss" "$trial_dir/ref-dp1/runlog.h5" >/dev/null
reference ref-dp2 2 1 2 -
h5dump -b LE -d /steps/loss -o "$trial_dir/dp2.loss" "$trial_dir/ref-dp2/runlog.h5" >/dev/null
REF[1]=$trial_dir/dp1.loss REF[2]=$trial_dir/dp2.loss
reference save-pp4 4 4 1 "$trial_dir/ck4" ckpt.every=2
compare_losses "$trial_dir/save-pp4/runlog.h5" "${REF[1]}" || premise "pp=4 saving checkpoints vs 1 rank: $LOSS_NOTE"
reference save-pp2dp2 4 2 2 "$trial_dir/ck22" ckpt.every=3
compare_losses "$trial_dir/save-pp2dp2/runlog.h5" "${REF[2]}" || premise "pp=2 dp=2 saving vs pp=1 dp=2: $LOSS_NOTE"
CKPT_BYTES=$(stat -c %s "$trial_dir/ck4/ckpt-$STEPS.h5")
echo "faults: references: 1 rank = pp=4 (saving every 2 steps); pp=1 dp=2 = pp=2 dp=2 (saving every 3 steps); checkpoints of $CKPT_BYTES bytes"

# ---- kill trials ------------------------------------------------------------------
kill_total=0 kill_during_write=0 kill_identical=0 kill_lost=0 kill_failed=0

# kill_run: one attempt of trial $n with the choices made: the run, the
# kill, the job's end. Sets MISSED=1 when the run ended before the kill.
kill_run() {
  local entry tmps seen=" " new=0 t0=$EPOCHSECONDS name
  train 4 "$pp" "$dp" "$trial_dir/run" "$trial_dir/ck" ckpt.every=$every
  job_start run "${CMD[@]}"
  KILLED=0 MISSED=0 KILL_STEP=0 KILL_CKPT=0
  while job_alive && (( EPOCHSECONDS - t0 < 300 )); do
    follow
    if [ ${#RANK_PIDS[@]} -lt 4 ]; then job_ranks 4 || { nap 0.005; continue; }; fi
    if [ "$mode" = write ]; then
      tmps=$(compgen -G "$trial_dir/ck/ckpt-*.h5.tmp")
      for name in $tmps; do
        [[ $seen == *" $name "* ]] || { seen+="$name "; new=$((new + 1)); }
      done
      if [ $new -ge "$write_k" ]; then
        [ "$delay_ms" -gt 0 ] && nap "0.00$delay_ms"
        break
      fi
      nap 0.002
    else
      if [ "$LAST_STEP" -ge "$kill_at_step" ]; then
        nap "$(printf '0.%03d' "$delay_ms")"
        break
      fi
      nap 0.01
    fi
  done
  follow
  KILL_STEP=$LAST_STEP KILL_CKPT=$LAST_CKPT
  entry=${RANK_PIDS[$victim]:-}
  if [ -n "$entry" ] && running "$entry" && job_alive; then
    kill -9 "${entry%%:*}" 2>/dev/null && KILLED=1 KILL_T=$EPOCHREALTIME
  fi
  job_wait 120
  # Missed: the run finished first (or the victim was already exiting);
  # ended or hung by itself before the kill: a failure of its own.
  NO_KILL=
  if [ $JOB_RC -eq 0 ] && grep -q '^summary:' "$JOB_OUT"; then MISSED=1
  elif [ $KILLED = 0 ]; then
    NO_KILL="the run $([ $JOB_HUNG = 1 ] && echo "hung (killed after 300 s)" || echo "exited $JOB_RC") before the kill: $(tail -n 3 "$JOB_ERR" | tr '\n' ' ')"
  fi
}

kill_trial() {
  local n=$1 attempt what where resume_ranks resume_pp resume_dp rstep note line
  # The choices, all made before the first attempt (a retry keeps them).
  dp=$(( n % 2 == 1 ? 1 : 2 )); pp=$((4 / dp))
  pick 2; every=$((2 + PICK))
  pick 4; victim=$PICK
  pick 2; mode=$([ $PICK = 0 ] && echo write || echo moment)
  pick $(( (STEPS - 1) / every )); write_k=$((PICK + 1))
  pick $((STEPS - 6)); kill_at_step=$PICK          # 0: during start-up
  if [ "$mode" = write ]; then pick 6; else pick 51; fi; delay_ms=$PICK
  pick 2; if [ $PICK = 1 ]; then resume_ranks=2 resume_pp=$((2 / dp)) resume_dp=$dp
          else resume_ranks=4 resume_pp=$pp resume_dp=$dp; fi
  if [ "$mode" = write ]; then what="the write of checkpoint $write_k + ${delay_ms} ms"
  elif [ "$kill_at_step" = 0 ]; then what="start-up + ${delay_ms} ms"
  else what="step $kill_at_step + ${delay_ms} ms"; fi
  PROBLEMS=()
  for attempt in 1 2 3; do
    trial_dir=$WORK/kill-$n-$attempt; mkdir -p "$trial_dir"
    kill_run
    [ $MISSED = 0 ] && break
    rm -rf "$trial_dir"
  done
  kill_total=$((kill_total + 1))
  line=$(printf 'kill %2d/%d: pp=%d dp=%d every=%d, SIGKILL rank %d at %s' "$n" "$TRIALS" "$pp" "$dp" "$every" "$victim" "$what")
  [ "$attempt" -gt 1 ] && line+=" (attempt $attempt: the run had ended before the kill)"
  if [ $MISSED = 1 ] || [ -n "$NO_KILL" ]; then
    kill_failed=$((kill_failed + 1)); KEEP_WORK=1
    echo "$line: FAIL: ${NO_KILL:-the run ended before the kill in 3 attempts}"
    return
  fi
  line+=" (step $KILL_STEP)"
  [ $JOB_RC -eq 0 ] && PROBLEMS+=("mpiexec exited 0 although rank $victim was killed")
  # The job's end.
  [ $JOB_HUNG = 1 ] && PROBLEMS+=("hang: mpiexec still running 120 s after the kill (killed it; stderr: $(tail -n 2 "$JOB_ERR" | tr '\n' ' '))")
  [ -n "$JOB_LEFT" ] && PROBLEMS+=("processes of the job left running after mpiexec returned: pids$JOB_LEFT (killed them)")
  line+=": exit $JOB_RC $(awk -v a="$KILL_T" -v b="$JOB_END" 'BEGIN{printf "%.2f", b-a}') s after the kill"
  # What it left: the checkpoints it announced must be there and whole.
  check_dir "$trial_dir/ck"
  local lost=0
  [ -n "$DIR_PROBLEM" ] && { PROBLEMS+=("after the kill: $DIR_PROBLEM"); lost=1; }
  if [ "$DIR_LATEST" -lt "$KILL_CKPT" ]; then
    PROBLEMS+=("after the kill the newest complete checkpoint is step $DIR_LATEST, but ckpt-$KILL_CKPT.h5 had been announced"); lost=1
  fi
  if [ -n "$DIR_TMPS" ]; then
    kill_during_write=$((kill_during_write + 1)); line+=", left${DIR_TMPS}"
  fi
  line+=", latest $([ "$DIR_LATEST" -gt 0 ] && echo "ckpt-$DIR_LATEST.h5" || echo none)"
  # The resume, to the end.
  train "$resume_ranks" "$resume_pp" "$resume_dp" "$trial_dir/run" "$trial_dir/ck" ckpt.every=$every ckpt.resume=auto
  job_start resume "${CMD[@]}"; job_wait 300
  [ $JOB_HUNG = 1 ] && PROBLEMS+=("the resumed run hung (killed after 300 s)")
  [ -n "$JOB_LEFT" ] && PROBLEMS+=("processes of the resumed run left running: pids$JOB_LEFT")
  [ $JOB_RC -ne 0 ] && PROBLEMS+=("the resumed run exited $JOB_RC: $(tail -n 3 "$JOB_ERR" | tr '\n' ' ')")
  rstep=$(resumed_step "$JOB_OUT")
  if [ "$rstep" != "$DIR_LATEST" ]; then
    PROBLEMS+=("resumed from step $rstep, but the newest complete checkpoint was step $DIR_LATEST ($(grep -m1 '^resume' "$JOB_OUT"))")
    [ "$rstep" -lt "$DIR_LATEST" ] && lost=1
  fi
  line+="; resumed on $resume_ranks ranks (pp=$resume_pp dp=$resume_dp) from step $rstep"
  local identical=0
  if compare_losses "$trial_dir/run/runlog.h5" "${REF[$dp]}"; then identical=1; else PROBLEMS+=("$LOSS_NOTE"); fi
  line+=": $LOSS_NOTE"
  check_dir "$trial_dir/ck"
  [ -n "$DIR_PROBLEM" ] && { PROBLEMS+=("after the resume: $DIR_PROBLEM"); lost=1; }
  [ "$DIR_LATEST" = "$STEPS" ] || PROBLEMS+=("after the resume latest is step $DIR_LATEST, not $STEPS")
  line+=", $DIR_COUNT checkpoints check out"
  [ $identical = 1 ] && [ $JOB_RC -eq 0 ] && kill_identical=$((kill_identical + 1))
  [ $lost = 1 ] && kill_lost=$((kill_lost + 1))
  if [ ${#PROBLEMS[@]} -eq 0 ]; then
    echo "$line: ok"; rm -rf "$trial_dir"
  else
    kill_failed=$((kill_failed + 1)); KEEP_WORK=1
    echo "$line: FAIL (files in $trial_dir)"; say_problems
  fi
}

for n in $(seq 1 "$TRIALS"); do kill_trial "$n"; done

# ---- full-disk and read-only trials ----------------------------------------------
disk_total=0 disk_clean=0 disk_skipped=0 ro_total=0 ro_clean=0 ro_skipped=0
NO_SPACE='No space left on device|ENOSPC|[Dd]isk (is )?full|MiB free, but a checkpoint of this run needs'
READ_ONLY='[Rr]ead-only file system|EROFS|not writable|read-only'
[ "$(id -u)" = 0 ] || echo "faults: not root: the full-disk and read-only trials need mount and are skipped"

# one_message WHAT REGEX PATH: the failed run's status and stderr: exit 2 (or
# 1 where allowed: $ALLOW_1), one non-empty line, matching REGEX and naming PATH.
one_message() {
  local what=$1 regex=$2 path=$3 lines
  lines=$(stderr_lines "$JOB_ERR")
  if [ $JOB_RC -eq 0 ]; then PROBLEMS+=("exit 0: the run did not report the $what")
  elif [ $JOB_RC -ne 2 ] && ! { [ "${ALLOW_1:-0}" = 1 ] && [ $JOB_RC -eq 1 ]; }; then
    PROBLEMS+=("exit $JOB_RC, want 2$([ "${ALLOW_1:-0}" = 1 ] && echo " (or 1)")")
  fi
  if grep -Eq 'BAD TERMINATION|Segmentation|signal [0-9]|Aborted|core dumped' "$JOB_ERR"; then
    PROBLEMS+=("a crash: $(grep -Em1 'BAD TERMINATION|Segmentation|signal [0-9]|Aborted|core dumped' "$JOB_ERR")")
  fi
  if [ "$lines" -ne 1 ]; then PROBLEMS+=("$lines lines on stderr, want one message")
  else
    grep -Eq -- "$regex" "$JOB_ERR" || PROBLEMS+=("the message does not name the $what (/$regex/)")
    grep -qF -- "$path" "$JOB_ERR" || PROBLEMS+=("the message does not name $path")
  fi
  [ $JOB_HUNG = 1 ] && PROBLEMS+=("hang: killed after 120 s")
  [ -n "$JOB_LEFT" ] && PROBLEMS+=("processes left running after mpiexec returned: pids$JOB_LEFT")
}
show_stderr() {   # the failed run's stderr, indented, for the report
  echo "    stderr ($(stderr_lines "$JOB_ERR") lines, exit $JOB_RC, last step $LAST_STEP):"
  sed 's/^/      | /' "$JOB_ERR" | head -n 20
}

# disk_trial NAME DP WHERE(ckpt|out) MODE(small|three|fill|full) [key=value...]:
# see the top; the settings go to both runs.
disk_trial() {
  local name=$1 dp=$2 where=$3 mode=$4 pp=$(( 4 / $2 )) mnt size ck out fill_at= what rstep
  shift 4
  trial_dir=$WORK/$name; mkdir -p "$trial_dir"; mnt=$trial_dir/mnt
  case $mode in
    small) size=$((CKPT_BYTES / 2 / 1024))k; what="a tmpfs of $size, less than one checkpoint" ;;
    three) size=$((CKPT_BYTES * 5 / 2 / 1024))k; what="a tmpfs of $size, room for 2.5 checkpoints" ;;
    fill)  size=$((CKPT_BYTES * 8 / 1024))k; pick 8; fill_at=$((3 + PICK))
           what="a tmpfs of $size filled up after step $fill_at" ;;
    full)  size=$((CKPT_BYTES * 8 / 1024))k; fill_at=0; what="a tmpfs of $size, full before the start" ;;
  esac
  [ $# -gt 0 ] && what+=" ($*)"
  disk_total=$((disk_total + 1))
  local line; line=$(printf 'disk %-10s pp=%d dp=%d, %s on %s' "$name:" "$pp" "$dp" \
    "$([ "$where" = ckpt ] && echo ckpt.dir || echo run.out_dir)" "$what")
  if [ "$(id -u)" != 0 ] || ! mount_at "$mnt" -t tmpfs -o size="$size" tmpfs; then
    disk_skipped=$((disk_skipped + 1))
    echo "$line: SKIP: cannot mount a tmpfs ($(cat "$trial_dir/mount.err" 2>/dev/null || echo 'not root'))"
    return
  fi
  if [ "$where" = ckpt ]; then ck=$mnt/ck out=$trial_dir/run; else ck=$trial_dir/ck out=$mnt/run; fi
  PROBLEMS=()
  [ "$fill_at" = 0 ] && dd if=/dev/zero of="$mnt/filler" bs=64k status=none 2>/dev/null
  train 4 "$pp" "$dp" "$out" "$ck" ckpt.every=2 "$@"
  job_start run "${CMD[@]}"
  if [ -n "$fill_at" ] && [ "$fill_at" -gt 0 ]; then
    while job_alive && (( EPOCHSECONDS - ${JOB_T0%.*} < 300 )); do
      follow; [ "$LAST_STEP" -ge "$fill_at" ] && break; nap 0.01
    done
    dd if=/dev/zero of="$mnt/filler" bs=64k status=none 2>/dev/null
  fi
  job_wait 120
  ALLOW_1=1 one_message "full disk" "$NO_SPACE" "$mnt"
  line+=": exit $JOB_RC after step $LAST_STEP"
  check_dir "$ck"
  [ -n "$DIR_PROBLEM" ] && PROBLEMS+=("after the failure: $DIR_PROBLEM")
  [ "$DIR_LATEST" -lt "$LAST_CKPT" ] && PROBLEMS+=("ckpt-$LAST_CKPT.h5 was announced but the newest complete checkpoint is step $DIR_LATEST")
  line+=", latest $([ "$DIR_LATEST" -gt 0 ] && echo "ckpt-$DIR_LATEST.h5" || echo none)${DIR_TMPS:+, left$DIR_TMPS}"
  local first=("${PROBLEMS[@]}") err_copy=$trial_dir/failed.err rc_copy=$JOB_RC step_copy=$LAST_STEP
  cp "$JOB_ERR" "$err_copy"
  # Room again, then the resume from the previous complete checkpoint.
  rm -f "$mnt/filler"
  mount -o remount,size=64m "$mnt" 2>/dev/null || PROBLEMS+=("could not enlarge $mnt")
  train 4 "$pp" "$dp" "$out" "$ck" ckpt.every=2 ckpt.resume=auto "$@"
  job_start resume "${CMD[@]}"; job_wait 300
  [ $JOB_RC -ne 0 ] && PROBLEMS+=("the resume exited $JOB_RC: $(tail -n 3 "$JOB_ERR" | tr '\n' ' ')")
  [ $JOB_HUNG = 1 ] && PROBLEMS+=("the resume hung")
  rstep=$(resumed_step "$JOB_OUT")
  [ "$rstep" != "$DIR_LATEST" ] && PROBLEMS+=("resumed from step $rstep, want $DIR_LATEST")
  compare_losses "$out/runlog.h5" "${REF[$dp]}" || PROBLEMS+=("after the resume: $LOSS_NOTE")
  line+="; resumed from step $rstep: $LOSS_NOTE"
  check_dir "$ck"
  [ -n "$DIR_PROBLEM" ] && PROBLEMS+=("after the resume: $DIR_PROBLEM")
  unmount "$mnt"
  if [ ${#PROBLEMS[@]} -eq 0 ]; then
    disk_clean=$((disk_clean + 1)); echo "$line: clean"
  else
    KEEP_WORK=1; echo "$line: FAIL (files in $trial_dir)"; say_problems
    echo "    stderr of the failed run ($(stderr_lines "$err_copy") lines, exit $rc_copy, last step $step_copy):"
    sed 's/^/      | /' "$err_copy" | head -n 20
  fi
}

# ro_trial NAME DP KIND(ckpt|bind|out): see the top.
ro_trial() {
  local name=$1 dp=$2 kind=$3 pp=$(( 4 / $2 )) mnt ck out what path ok=1
  trial_dir=$WORK/$name; mkdir -p "$trial_dir"; mnt=$trial_dir/mnt
  ro_total=$((ro_total + 1))
  case $kind in
    ckpt) what="ckpt.dir a read-only tmpfs"; ck=$mnt out=$trial_dir/run; path=$mnt
          [ "$(id -u)" = 0 ] && mount_at "$mnt" -t tmpfs -o ro,size=1m tmpfs || ok=0 ;;
    bind) what="ckpt.dir a read-only bind mount holding ckpt-4.h5 and ckpt-8.h5"; ck=$mnt out=$trial_dir/run; path=$mnt
          train 1 1 1 "$trial_dir/src-run" "$trial_dir/src" ckpt.every=4 train.steps=8
          "${CMD[@]}" >/dev/null 2>&1 || ok=0
          [ $ok = 1 ] && [ "$(id -u)" = 0 ] && mount_at "$mnt" --bind "$trial_dir/src" \
            && { mount -o remount,bind,ro "$mnt" 2>"$trial_dir/mount.err" || ok=0; } || ok=0 ;;
    out)  what="run.out_dir on a read-only tmpfs (to be created)"; ck=$trial_dir/ck out=$mnt/run; path=$mnt/run
          [ "$(id -u)" = 0 ] && mount_at "$mnt" -t tmpfs -o ro,size=1m tmpfs || ok=0 ;;
  esac
  local line; line=$(printf 'read-only %-8s pp=%d dp=%d, %s' "$name:" "$pp" "$dp" "$what")
  if [ $ok = 0 ]; then
    ro_skipped=$((ro_skipped + 1))
    echo "$line: SKIP: cannot set up the mount ($(cat "$trial_dir/mount.err" 2>/dev/null || echo 'not root'))"
    [ -d "$mnt" ] && unmount "$mnt"
    return
  fi
  PROBLEMS=()
  train 4 "$pp" "$dp" "$out" "$ck" ckpt.every=2
  job_start run "${CMD[@]}"; job_wait 120
  one_message "read-only file system" "$READ_ONLY" "$path"
  line+=": exit $JOB_RC, $([ "$LAST_STEP" = 0 ] && echo "before the first step" || echo "after step $LAST_STEP")"
  unmount "$mnt"
  if [ ${#PROBLEMS[@]} -eq 0 ]; then
    ro_clean=$((ro_clean + 1)); echo "$line: clean: $(head -c 300 "$JOB_ERR")"
  else
    KEEP_WORK=1; echo "$line: FAIL (files in $trial_dir)"; say_problems; show_stderr
  fi
}

disk_trial disk-small 1 ckpt small
disk_trial disk-three 2 ckpt three
disk_trial disk-fill 1 ckpt fill
disk_trial out-full 1 out full
# The run log's datasets hold 170-1024 steps a chunk, so 24 steps never
# need new space once it exists; a trace of every step does.
disk_trial out-fill 2 out fill run.trace_from=1 run.trace_steps=$STEPS
ro_trial ro-ckpt 1 ckpt
ro_trial ro-bind 2 bind
ro_trial ro-out 1 out

# ---- summary ---------------------------------------------------------------------
summary="faults: $kill_total kill trials ($kill_during_write during a checkpoint write), $kill_identical resumed bit-identical, $kill_lost lost"
summary+="; $disk_total full-disk trials, $disk_clean clean"
[ $disk_skipped -gt 0 ] && summary+=" ($disk_skipped skipped)"
summary+="; $ro_total read-only trials, $ro_clean clean"
[ $ro_skipped -gt 0 ] && summary+=" ($ro_skipped skipped)"
echo "$summary (seed $SEED)"
failed=$(( kill_failed + disk_total - disk_clean - disk_skipped + ro_total - ro_clean - ro_skipped ))
left=
for entry in $TRACKED; do running "$entry" && left+=" ${entry%%:*}"; done
[ -n "$left" ] && { echo "faults: processes of the campaign still running at its end: pids$left"; failed=$((failed + 1)); }
[ $failed -eq 0 ] || { echo "faults: $failed trials failed"; exit 1; }
