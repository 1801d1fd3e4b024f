# A real, private Slurm for shell tests: one controller and one node on
# localhost, state and logs in a temporary directory, non-default ports
# (16817/16818, or the next free pair), auth/none (no munge), MpiDefault=pmi2,
# no systemd. Sourced by tests:
#
#   . tests/slurm-lib.sh
#   slurm_start || exit 77          # prints why on failure: the test is skipped
#   job=$(sbatch --parsable --ntasks=4 ...)
#   slurm_wait_job "$job" 30        # prints the final state; 0 when COMPLETED
#   slurm_wait_queue_empty 60       # a whole chain: until no job is left
#   slurm_job_field "$job" NumTasks # any field of `scontrol show job`
#   slurm_stop                      # also run by the EXIT trap slurm_start sets
#
# slurm_start installs Debian's slurmctld, slurmd and slurm-client when they
# are missing (root only), exports SLURM_CONF, and sets SLURM_TEST_DIR (the
# temporary directory, removed by slurm_stop) and SLURM_TEST_NODE_CPUS (the
# node has at least 8 CPUs whatever the machine has, so 4-task jobs fit on 2
# cores). Jobs keep their records for 10 minutes (MinJobAge), so a test can
# read them after they end. Daemons are stopped by the PIDs this file
# started them with, never by name. Tests that set their own EXIT trap must
# call slurm_stop from it.

SLURM_TEST_DIR=
SLURM_TEST_NODE_CPUS=
slurm_ctld_pid=
slurm_d_pid=

# Installs the Slurm packages if a command is missing. Returns 1 with the
# reason on stdout.
slurm_install() {
    local missing=0 command
    for command in slurmctld slurmd sbatch srun squeue scontrol scancel sinfo; do
        command -v "$command" >/dev/null 2>&1 || missing=1
    done
    [ $missing = 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "Slurm is not installed and installing it needs root (apt-get install slurmctld slurmd slurm-client)"
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "Slurm is not installed and there is no apt-get to install it"
        return 1
    fi
    echo "slurm-lib: installing slurmctld slurmd slurm-client from Debian"
    # Debian starts services from maintainer scripts unless policy-rc.d
    # forbids it; without one, the packages' munge and slurm daemons would be
    # left running. Add a temporary one only if the system has none.
    local policy=/usr/sbin/policy-rc.d added_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added_policy=1
    fi
    local packages=(slurmctld slurmd slurm-client) log
    log=$(mktemp /tmp/slurm-install.XXXXXX)
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${packages[@]}" >"$log" 2>&1; then
        apt-get update -q >>"$log" 2>&1
        apt-get install -y -q --no-install-recommends "${packages[@]}" >>"$log" 2>&1
    fi
    [ $added_policy = 1 ] && rm -f "$policy"
    for command in slurmctld slurmd sbatch srun squeue scontrol scancel sinfo; do
        if ! command -v "$command" >/dev/null 2>&1; then
            tail -n 5 "$log" | sed 's/^/    /'
            rm -f "$log"
            echo "apt-get could not install Slurm ($command is still missing)"
            return 1
        fi
    done
    rm -f "$log"
    return 0
}

# True when something listens on 127.0.0.1:PORT.
slurm_port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Writes $SLURM_TEST_DIR/slurm.conf for controller port CTLD_PORT and node
# port CTLD_PORT + 1.
slurm_write_conf() {
    local port=$1 dir=$SLURM_TEST_DIR
    # At least 8 CPUs on the node whatever the machine has, so a 4-task job
    # fits on 2 cores: slurmd believes the configuration (config_overrides).
    local cpus
    cpus=$(nproc)
    [ "$cpus" -lt 8 ] && cpus=8
    SLURM_TEST_NODE_CPUS=$cpus
    cat >"$dir/slurm.conf" <<EOF
# Written by tests/slurm-lib.sh for one test run.
ClusterName=dynmotest
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=pmi2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

# Starts slurmctld and slurmd and waits (at most 30 s) until the node is
# idle. Returns 1 after printing the reason as the last line, with nothing
# left running.
slurm_start() {
    local reason
    if ! reason=$(slurm_install); then
        echo "$reason"
        echo "skipped: no Slurm: $(tail -n 1 <<<"$reason")"
        return 1
    fi
    [ -n "$reason" ] && echo "$reason"
    if [ "$(id -u)" -ne 0 ]; then
        echo "skipped: slurmd must run as root to start jobs, and this is uid $(id -u)"
        return 1
    fi
    # A test may itself run inside a Slurm job: nothing of that job's
    # environment may reach the private cluster.
    local name
    for name in $(compgen -e); do
        case $name in SLURM_*|SBATCH_*|SALLOC_*|SRUN_*) unset "$name" ;; esac
    done
    SLURM_TEST_DIR=$(mktemp -d /tmp/dynmo-slurm.XXXXXX) || { echo "skipped: cannot create a temporary directory"; return 1; }
    chmod 755 "$SLURM_TEST_DIR"
    mkdir -p "$SLURM_TEST_DIR/state" "$SLURM_TEST_DIR/spool"
    trap slurm_stop EXIT
    trap 'exit 143' TERM
    trap 'exit 130' INT
    local port=${SLURM_TEST_PORT:-16817} tries=0
    while slurm_port_busy "$port" || slurm_port_busy $((port + 1)); do
        tries=$((tries + 1))
        if [ $tries -ge 10 ]; then
            slurm_stop
            echo "skipped: ports 16817..$((port + 1)) are all in use"
            return 1
        fi
        port=$((port + 10))
    done
    slurm_write_conf "$port"
    export SLURM_CONF=$SLURM_TEST_DIR/slurm.conf
    # The marker variable names this instance in the daemons' environment
    # (slurmstepd inherits it), so that slurm_stop finds every daemon
    # process this test started, and only those.
    DYNMO_SLURM_INSTANCE=$SLURM_TEST_DIR slurmctld -D -i >"$SLURM_TEST_DIR/slurmctld.out" 2>&1 &
    slurm_ctld_pid=$!
    DYNMO_SLURM_INSTANCE=$SLURM_TEST_DIR slurmd -D -N localhost >"$SLURM_TEST_DIR/slurmd.out" 2>&1 &
    slurm_d_pid=$!
    local waited=0 state=
    while [ $waited -lt 300 ]; do
        state=$(sinfo -h -n localhost -o %T 2>/dev/null)
        [ "$state" = idle ] && break
        if ! kill -0 "$slurm_ctld_pid" 2>/dev/null || ! kill -0 "$slurm_d_pid" 2>/dev/null; then
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    if [ "$state" != idle ]; then
        echo "--- slurmctld:"; tail -n 15 "$SLURM_TEST_DIR/slurmctld.out"
        echo "--- slurmd:"; tail -n 15 "$SLURM_TEST_DIR/slurmd.out"
        local why="the node is '${state:-unknown}' after $((waited / 10)) s"
        kill -0 "$slurm_ctld_pid" 2>/dev/null || why="slurmctld exited"
        kill -0 "$slurm_d_pid" 2>/dev/null || why="slurmd exited"
        slurm_stop
        echo "skipped: Slurm did not start: $why (logs above)"
        return 1
    fi
    echo "slurm-lib: slurmctld (pid $slurm_ctld_pid) and slurmd (pid $slurm_d_pid) on port $port, $SLURM_TEST_NODE_CPUS CPUs, in $SLURM_TEST_DIR"
    return 0
}

# Prints field NAME of `scontrol show job JOBID` (e.g. JobState, NumTasks,
# ExitCode, StartTime).
slurm_job_field() {
    scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# Waits at most TIMEOUT seconds for job JOBID to end and prints its final
# state. Returns 0 when it COMPLETED, 1 for another final state, 2 on timeout
# (printing the current state).
slurm_wait_job() {
    local job=$1 timeout=$2 waited=0 state
    while :; do
        state=$(slurm_job_field "$job" JobState)
        case $state in
            COMPLETED) echo "$state"; return 0 ;;
            FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
                echo "$state"; return 1 ;;
        esac
        if [ $waited -ge $((timeout * 10)) ]; then
            echo "${state:-unknown}"; return 2
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

# Waits at most TIMEOUT seconds until no job is pending or running. Returns
# 1 on timeout.
slurm_wait_queue_empty() {
    local timeout=$1 waited=0
    while [ -n "$(squeue -h -o %i 2>/dev/null)" ]; do
        [ $waited -ge $((timeout * 10)) ] && return 1
        sleep 0.1
        waited=$((waited + 1))
    done
    return 0
}

# True when process PID descends from this shell (the test's own commands,
# which share its SLURM_CONF, are not Slurm's to kill).
slurm_is_ours() {
    local pid=$1 stat rest
    while [ "$pid" -gt 1 ]; do
        [ "$pid" = "$$" ] && return 0
        { stat=$(<"/proc/$pid/stat"); } 2>/dev/null || return 1
        rest=${stat##*) }
        set -- $rest
        pid=$2
    done
    return 1
}

# PIDs of live processes of this Slurm instance: the daemons (marked by
# DYNMO_SLURM_INSTANCE), slurmstepd (which keeps the instance's slurmd.log
# open but clears its environment), and the jobs' processes (which inherit
# SLURM_CONF from the sbatch that submitted them).
slurm_instance_pids() {
    local proc pid fd target variable
    local -a variables
    for proc in /proc/[0-9]*; do
        pid=${proc#/proc/}
        slurm_is_ours "$pid" && continue
        variables=()
        mapfile -d '' variables 2>/dev/null <"$proc/environ"
        for variable in "${variables[@]}"; do
            if [ "$variable" = "DYNMO_SLURM_INSTANCE=$SLURM_TEST_DIR" ] ||
               [ "$variable" = "SLURM_CONF=$SLURM_TEST_DIR/slurm.conf" ]; then
                echo "$pid"; continue 2
            fi
        done
        # Only a slurmstepd needs its descriptors read (readlink is slow).
        read -r -d '' target 2>/dev/null <"$proc/cmdline"
        [[ $target == slurmstepd* ]] || continue
        for fd in "$proc"/fd/*; do
            target=$(readlink "$fd" 2>/dev/null) || continue
            if [[ $target == "$SLURM_TEST_DIR"/* ]]; then
                echo "$pid"; continue 2
            fi
        done
    done
}

# Cancels every job, stops the daemons by PID (SIGTERM, then SIGKILL after
# 10 s), kills by PID whatever of this instance is still alive (a
# slurmstepd, a job's process), and removes the temporary directory. Safe to
# call twice.
slurm_stop() {
    [ -n "$SLURM_TEST_DIR" ] || return 0
    if [ -n "$slurm_ctld_pid" ] && kill -0 "$slurm_ctld_pid" 2>/dev/null; then
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null)
        if [ -n "$jobs" ]; then
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null
            slurm_wait_queue_empty 15
        fi
    fi
    local pid waited
    for pid in $slurm_d_pid $slurm_ctld_pid; do
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in $slurm_d_pid $slurm_ctld_pid; do
        waited=0
        while kill -0 "$pid" 2>/dev/null && [ $waited -lt 100 ]; do
            sleep 0.1; waited=$((waited + 1))
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    local leftovers
    leftovers=$(slurm_instance_pids)
    if [ -n "$leftovers" ]; then
        echo "slurm-lib: killing leftover processes of this instance:" $leftovers
        for pid in $leftovers; do
            kill -KILL "$pid" 2>/dev/null
        done
    fi
    slurm_ctld_pid= slurm_d_pid=
    rm -rf "$SLURM_TEST_DIR"
    SLURM_TEST_DIR=
    return 0
}

# The start of a test that runs dynmo's chain on the private Slurm: starts
# Slurm (exit 77, skipped, when it cannot), makes the test's directory $dir
# (/tmp/dynmo-NAME-test.XXXXXX, removed with Slurm on exit) and enters it,
# makes DYNMO absolute and prepares $dir/data from the GPL's text. Sets
# script, the chain's batch script.
slurm_chain_test_begin() {
    DYNMO=$(cd "$(dirname "$DYNMO")" && pwd)/$(basename "$DYNMO")
    script=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../jobscripts/dynmo-chain.sbatch
    slurm_start || exit 77
    dir=$(mktemp -d "/tmp/dynmo-$1-test.XXXXXX")
    chmod 755 "$dir"
    trap 'slurm_stop; rm -rf "$dir"' EXIT
    cd "$dir" || exit 1
    "$DYNMO" prepare --out "$dir/data" /usr/share/common-licenses/GPL-3 >/dev/null || fail "prepare"
}
