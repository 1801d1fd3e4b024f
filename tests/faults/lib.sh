# Helpers of the fault campaign (tests/faults/campaign.sh): jobs whose every
# process is known by pid and start time, one seeded stream of random
# choices, mounts undone at exit, and the checks the trials share.
# Nothing here finds a process by its name or signals one it did not start:
# a job's processes are the launcher's descendants, read from /proc while
# it runs, and each is signalled only while its start time still matches.

# ---- random choices --------------------------------------------------------
# One stream, seeded once (RANDOM=$SEED). pick N puts 0..N-1 in $PICK; it
# must never run in a subshell, or the stream would fork.
pick() { PICK=$((RANDOM % $1)); }

# nap SECONDS: sleeps without forking (a read that times out on a pipe
# nobody writes to), so polling every few milliseconds costs little.
exec {NAP_FD}<> <(:)
nap() { read -r -t "$1" -u "$NAP_FD" _ || true; }

# ---- processes -------------------------------------------------------------
# proc_read PID: P_STATE and P_START (field 22 of /proc/PID/stat, the start
# time in clock ticks, which tells a process from a later one with its
# pid). Returns 1 when there is no such process.
proc_read() {
  local stat fields
  { read -r stat < "/proc/$1/stat"; } 2>/dev/null || return 1
  read -r -a fields <<<"${stat##*) }"
  P_STATE=${fields[0]}; P_START=${fields[19]}
}
# running PID:START: the process is still the one recorded, and not a zombie.
running() {
  proc_read "${1%%:*}" || return 1
  [ "$P_START" = "${1##*:}" ] && [ "$P_STATE" != Z ] && [ "$P_STATE" != X ]
}

TRACKED=" "   # every PID:START the campaign started; the exit trap ends the live ones
JOB_PID=; JOB_PIDS=" "

# job_start NAME CMD...: runs CMD in a session of its own (a Ctrl-C of the
# campaign reaches the campaign only; its trap ends the job), stdout in
# $JOB_OUT, stderr in $JOB_ERR. Follows stdout from the start (follow).
job_start() {
  local name=$1; shift
  JOB_NAME=$name JOB_OUT=$trial_dir/$name.out JOB_ERR=$trial_dir/$name.err
  : >"$JOB_OUT"; : >"$JOB_ERR"
  setsid "$@" >"$JOB_OUT" 2>"$JOB_ERR" &
  JOB_PID=$! JOB_PIDS=" " JOB_T0=$EPOCHREALTIME JOB_HUNG=0 JOB_LEFT=
  RANK_PIDS=()
  job_track
  [ -n "${FOLLOW_FD:-}" ] && exec {FOLLOW_FD}<&-
  exec {FOLLOW_FD}< "$JOB_OUT"
  FOLLOW_PART= LAST_STEP=0 LAST_CKPT=0
}

# job_track: adds the launcher's descendants (mpiexec, its proxy, the
# ranks) to JOB_PIDS, reading /proc/PID/task/*/children (no fork), or
# asking pgrep -P where the kernel lacks that file.
CHILDREN_FILE=1; [ -e /proc/$$/task/$$/children ] || CHILDREN_FILE=0
job_track() {
  local queue=("$JOB_PID") p t kids k
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}; queue=("${queue[@]:1}")
    proc_read "$p" || continue
    if [[ $JOB_PIDS != *" $p:"* ]]; then
      JOB_PIDS+="$p:$P_START "; TRACKED+="$p:$P_START "
    fi
    if [ $CHILDREN_FILE = 1 ]; then
      for t in /proc/"$p"/task/*/children; do
        kids=
        { read -r kids < "$t"; } 2>/dev/null
        for k in $kids; do queue+=("$k"); done
      done
    else
      for k in $(pgrep -P "$p"); do queue+=("$k"); done
    fi
  done
}

# job_ranks: RANK_PIDS[r] is the pid of MPI rank r (PMI_RANK in its
# environment) among the job's processes running build/dynmo; returns 1
# until all $1 ranks are there.
job_ranks() {
  local want=$1 entry p var env
  job_track
  for entry in $JOB_PIDS; do
    p=${entry%%:*}
    [ /proc/"$p"/exe -ef "$DYNMO" ] || continue
    mapfile -d '' env < "/proc/$p/environ" 2>/dev/null || continue
    for var in "${env[@]}"; do
      [[ $var == PMI_RANK=* ]] && RANK_PIDS[${var#PMI_RANK=}]=$entry
    done
  done
  [ ${#RANK_PIDS[@]} -ge "$want" ]
}

# follow: reads what the job added to stdout since the last call: LAST_STEP
# (the last "step N/" line) and LAST_CKPT (the step of the last
# "checkpoint:" line, which dynmo prints once `latest` names the file).
follow() {
  local line s
  while IFS= read -r -u "$FOLLOW_FD" line; do
    line=$FOLLOW_PART$line; FOLLOW_PART=
    case $line in
      "step "*) s=${line#step }; LAST_STEP=${s%%/*} ;;
      "checkpoint: "*) s=${line##*/ckpt-}; LAST_CKPT=${s%%.h5*} ;;
    esac
  done
  FOLLOW_PART+=$line
}

# job_alive: the launcher has not exited (a zombie awaiting wait counts as exited).
job_alive() { proc_read "$JOB_PID" && [ "$P_STATE" != Z ]; }

# job_kill_all: SIGKILL to every process of the job still running.
job_kill_all() {
  local entry
  for entry in $JOB_PIDS; do running "$entry" && kill -9 "${entry%%:*}" 2>/dev/null; done
}

# job_wait DEADLINE_S: waits for the launcher. JOB_RC is its status; a
# launcher still there after DEADLINE_S is a hang (JOB_HUNG=1; the job is
# killed). JOB_LEFT lists the job's processes still running 2 s after the
# launcher returned (they are killed). JOB_SECS: wall time since the
# start; JOB_END: when the launcher returned ($EPOCHREALTIME).
job_wait() {
  local deadline=$1 t0=$EPOCHSECONDS entry i
  while job_alive; do
    job_track
    if (( EPOCHSECONDS - t0 >= deadline )); then JOB_HUNG=1; job_kill_all; break; fi
    nap 0.02
  done
  wait "$JOB_PID"; JOB_RC=$?; JOB_END=$EPOCHREALTIME
  follow
  for i in $(seq 1 20); do
    JOB_LEFT=
    for entry in $JOB_PIDS; do running "$entry" && JOB_LEFT+=" ${entry%%:*}"; done
    [ -z "$JOB_LEFT" ] && break
    nap 0.1
  done
  [ -n "$JOB_LEFT" ] && job_kill_all
  JOB_SECS=$(awk -v a="$JOB_T0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')
}

# ---- mounts ----------------------------------------------------------------
MOUNTS=()
# mount_at DIR MOUNT-ARGS...: mounts and remembers DIR; returns mount's status.
mount_at() {
  local target=$1; shift
  mkdir -p "$target"
  mount "$@" "$target" 2>"$trial_dir/mount.err" || return 1
  MOUNTS+=("$target")
}
# unmount DIR: unmounts (lazily if busy) and forgets it.
unmount() {
  local i
  umount "$1" 2>/dev/null || umount -l "$1" 2>/dev/null
  for i in "${!MOUNTS[@]}"; do [ "${MOUNTS[i]}" = "$1" ] && unset 'MOUNTS[i]'; done
}

# cleanup: the exit trap: ends every process of ours still running, then
# undoes every mount, innermost first.
cleanup() {
  local entry i
  for entry in $TRACKED; do running "$entry" && kill -9 "${entry%%:*}" 2>/dev/null; done
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    [ -n "${MOUNTS[i]:-}" ] && { umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}"; }
  done
  if [ "${KEEP_WORK:-0}" = 1 ]; then
    echo "faults: trial files kept in $WORK"
  else
    rm -rf "$WORK"
  fi
}

# ---- checks ----------------------------------------------------------------
# check_dir CKPT_DIR: every complete checkpoint passes `dynmo check-ckpt`
# and `latest`, if there, names one of them. Sets DIR_LATEST (the step
# latest names, or the newest complete one without latest, or 0),
# DIR_TMPS (the .tmp files left) and DIR_PROBLEM (empty when all is well).
check_dir() {
  local d=$1 files=() out latest f
  DIR_LATEST=0 DIR_TMPS= DIR_PROBLEM= DIR_COUNT=0
  [ -d "$d" ] || return 0
  for f in "$d"/*.tmp; do [ -e "$f" ] && DIR_TMPS+=" ${f##*/}"; done
  for f in "$d"/ckpt-*.h5; do [ -e "$f" ] && files+=("$f"); done
  if [ ${#files[@]} -gt 0 ]; then
    out=$("$DYNMO" check-ckpt "${files[@]}" 2>&1) \
      || DIR_PROBLEM="check-ckpt fails on a complete checkpoint: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
  fi
  if [ -e "$d/latest" ]; then
    latest=$(<"$d/latest")
    if [[ $latest =~ ^ckpt-([0-9]+)\.h5$ ]] && [ -f "$d/$latest" ]; then
      DIR_LATEST=${BASH_REMATCH[1]}
    else
      DIR_PROBLEM+="${DIR_PROBLEM:+; }latest names '$latest', which is not a complete checkpoint here"
    fi
  elif [ ${#files[@]} -gt 0 ]; then
    f=$(printf '%s\n' "${files[@]##*/ckpt-}" | sort -n | tail -n 1)
    DIR_LATEST=${f%.h5}
  fi
  DIR_COUNT=${#files[@]}
}

# compare_losses RUNLOG REFERENCE: /steps/loss of RUNLOG equals the
# reference's bytes. LOSS_NOTE says how it compared.
compare_losses() {
  local got=$trial_dir/loss.bin
  rm -f "$got"
  if ! h5dump -b LE -d /steps/loss -o "$got" "$1" >/dev/null 2>&1; then
    LOSS_NOTE="cannot read /steps/loss of $1"; return 1
  fi
  if cmp -s "$got" "$2"; then
    LOSS_NOTE="$(( $(stat -c %s "$got") / 4 )) losses bit-identical"; return 0
  fi
  LOSS_NOTE=$(/usr/bin/python3 - "$got" "$2" <<'PY'
import sys, numpy as np
a, b = (np.fromfile(p, dtype="<f4") for p in sys.argv[1:3])
n = min(len(a), len(b))
diff = [i for i in range(n) if a[i].tobytes() != b[i].tobytes()]
if diff:
    i = diff[0]
    print(f"losses differ from the uninterrupted run from step {i + 1}: {a[i]!r} vs {b[i]!r} "
          f"({len(diff)} of {n} steps differ)", end="")
else:
    print(f"{len(a)} losses, the uninterrupted run has {len(b)}", end="")
PY
)
  return 1
}

# Lines on stderr, but for the one line MPICH itself prints when a rank
# calls MPI_Abort ("Abort(N) on node ..."): dynmo's message is the rest.
stderr_lines() { grep -v '^Abort([0-9]*) on node ' "$1" | grep -c .; }
