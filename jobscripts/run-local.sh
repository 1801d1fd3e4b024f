#!/bin/bash
# The chain of jobscripts/dynmo-chain.sbatch without Slurm: runs
# `mpiexec -n N dynmo train ...` in a loop and acts on dynmo's exit status
# (docs/jobs.md): 0 ends; 3 (re-pack) relaunches on the ranks, stages and
# layout of <ckpt.dir>/next_world; 75 (checkpointed on a signal) relaunches
# the same world; anything else stops with that status. SIGUSR1 sent to this
# script makes dynmo checkpoint and the chain go on in a fresh mpiexec;
# SIGTERM or SIGINT (Ctrl-C) makes dynmo checkpoint and the chain stop.
#
#   jobscripts/run-local.sh -n N [chain options] [--] --config FILE [section.key=value ...]
#
# Chain options (or environment variables):
#   -n N, --ranks N    DYNMO_RANKS      ranks of the first world (required)
#   --dynmo PATH       DYNMO            the dynmo binary (default: dynmo on PATH)
#   --ckpt-dir DIR     DYNMO_CKPT_DIR   appended as ckpt.dir=DIR; without it the
#                                       last ckpt.dir= override or [ckpt] dir
#   --max-jobs N       DYNMO_CHAIN_MAX  launches at most (default 50)
#                      DYNMO_CONFIG     --config FILE, when the arguments have none
#                      DYNMO_OVERRIDES  overrides put before the arguments' own
#                      MPIEXEC          the launcher (default mpiexec)
# It never reads a checkpoint and decides nothing about training.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/dynmo-chain.sbatch"

chain_install_traps
chain_parse_args "$@" || exit 2
chain_launcher=mpiexec
chain_forward_mode=ranks
ranks=${chain_ranks:-${DYNMO_RANKS:-}}
if ! [[ $ranks =~ ^[1-9][0-9]{0,5}$ ]]; then
    chain_error "give the number of ranks of the first world: -n N (got '${ranks}')"
    exit 2
fi
chain_find_ckpt_dir || exit 2
read -r -a mpiexec_command <<<"${MPIEXEC:-mpiexec}"

while :; do
    if [ -n "$chain_stop_signal" ]; then
        chain_log "got SIG$chain_stop_signal before launch $chain_link: stopping"
        exit 75
    fi
    chain_build_train_args
    export DYNMO_CHAIN_LINK=$chain_link
    chain_log "launch $chain_link of at most $chain_max_jobs: $ranks ranks, checkpoints in $chain_ckpt_dir_used"
    chain_log "run: ${mpiexec_command[*]} -n $ranks $chain_dynmo ${chain_train_args[*]}"
    started=$(date +%s)
    chain_run "${mpiexec_command[@]}" -n "$ranks" "$chain_dynmo" "${chain_train_args[@]}"
    status=$?
    # A SIGUSR1 after this launch ended needs no action: the next launch
    # resumes from the checkpoint this one just wrote.
    chain_signal_pending=
    chain_log "dynmo exited with status $status after $(( $(date +%s) - started )) s"
    case $status in
        0)
            chain_log "training finished: the chain ends at launch $chain_link"
            exit 0 ;;
        3)
            if [ -n "$chain_stop_signal" ]; then
                chain_log "re-pack requested, but this script got SIG$chain_stop_signal: stopping; the checkpoint is in $chain_ckpt_dir_used"
                exit 3
            fi
            chain_read_next_world "$chain_ckpt_dir_used/next_world" "$started" || exit 1
            chain_log "re-pack at step $next_step: $ranks -> $next_ranks ranks (pp $next_pp, dp $next_dp, layout $next_layout) from $next_checkpoint"
            ranks=$next_ranks
            chain_world=$next_pp:$next_dp:$next_layout ;;
        75)
            if [ -n "$chain_stop_signal" ]; then
                chain_log "checkpointed and stopped on SIG$chain_stop_signal; to continue from the checkpoint in $chain_ckpt_dir_used, run again with ckpt.resume=auto${chain_world:+ and --world $chain_world}"
                exit 75
            fi
            chain_log "checkpointed on a signal: relaunching the same world ($ranks ranks)" ;;
        *)
            chain_error "dynmo failed with status $status: the chain stops at launch $chain_link (see the output above)"
            exit "$status" ;;
    esac
    if [ -n "$chain_stop_signal" ]; then
        chain_log "got SIG$chain_stop_signal between launches: stopping; the checkpoint is in $chain_ckpt_dir_used"
        exit "$status"
    fi
    if [ $((chain_link + 1)) -gt "$chain_max_jobs" ]; then
        chain_error "the chain has reached --max-jobs $chain_max_jobs launches: stopping"
        exit 1
    fi
    chain_link=$((chain_link + 1))
done
