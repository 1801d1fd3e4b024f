#!/bin/bash
# A stand-in for `dynmo train` in the job-chain tests: it keeps only the
# exit-status and next_world contract of docs/jobs.md, so the chain scripts
# can be tested without training anything. One copy runs per rank.
#
#   mock-dynmo.sh train [--config FILE] [section.key=value ...] mock.plan=A1,A2,...
#
# Launch K of a chain (DYNMO_CHAIN_LINK, set by the chain scripts) performs
# action AK of mock.plan:
#   repack:R   write an (empty) ckpt-<step>.h5 and a next_world for R ranks
#              (pp = R, dp = 1, mock.layers blocks split evenly), exit 3
#   wait       touch mock.ready.<K>.<rank>, sleep until SIGUSR1 or SIGTERM,
#              spend mock.write_s seconds (default 0) writing ckpt-<step>.h5,
#              append `... wrote` to mock.ranks, exit 75 (exit 1 after
#              mock.timeout s without a signal)
#   exit:N     exit N
#   done       exit 0
# Files go to ckpt.dir (last ckpt.dir= override, else [ckpt] dir of the
# config): rank 0 appends one line per launch to mock.record:
#   link=K ntasks=<SLURM_NTASKS> size=<ranks> args=<arguments>
# and every rank appends `link=K rank=R size=S [signal=USR1]` to mock.ranks.
set -u
link=${DYNMO_CHAIN_LINK:-1}
rank=${PMI_RANK:-${SLURM_PROCID:-0}}
size=${PMI_SIZE:-${SLURM_NTASKS:-1}}

plan= ckpt_dir= config= layers=6 timeout=40 write_s=0 previous=
for arg in "$@"; do
    case $arg in
        mock.plan=*) plan=${arg#*=} ;;
        mock.layers=*) layers=${arg#*=} ;;
        mock.timeout=*) timeout=${arg#*=} ;;
        mock.write_s=*) write_s=${arg#*=} ;;
        ckpt.dir=*) ckpt_dir=${arg#*=} ;;
    esac
    [ "$previous" = --config ] && config=$arg
    previous=$arg
done
if [ -z "$ckpt_dir" ] && [ -n "$config" ]; then
    ckpt_dir=$(awk '/^[ \t]*\[/ { s = $0; gsub(/[][ \t]/, "", s) }
                    s == "ckpt" && /^[ \t]*dir[ \t]*=/ { v = $0; sub(/^[^=]*=[ \t]*/, "", v); sub(/[ \t]+;.*$/, "", v); d = v }
                    END { print d }' "$config")
fi
if [ -z "$ckpt_dir" ] || [ -z "$plan" ]; then
    echo "mock-dynmo: needs ckpt.dir and mock.plan" >&2
    exit 2
fi
mkdir -p "$ckpt_dir"
IFS=, read -r -a actions <<<"$plan"
action=${actions[$((link - 1))]:-missing}
step=$((link * 10))
if [ "$rank" = 0 ]; then
    echo "link=$link ntasks=${SLURM_NTASKS:-} size=$size args=$*" >>"$ckpt_dir/mock.record"
fi
echo "mock-dynmo: link $link rank $rank of $size: $action"

case $action in
    repack:*)
        ranks=${action#repack:}
        if [ "$rank" = 0 ]; then
            layout=
            for ((stage = 0; stage < ranks; stage++)); do
                blocks=$((layers / ranks + (stage < layers % ranks ? 1 : 0)))
                layout=$layout${layout:+,}$blocks
            done
            : >"$ckpt_dir/ckpt-$step.h5"
            printf '# written by mock-dynmo\nranks = %s\npp = %s\ndp = 1\nlayout = %s\nstep = %s\ncheckpoint = ckpt-%s.h5\n' \
                "$ranks" "$ranks" "$layout" "$step" "$step" >"$ckpt_dir/next_world.tmp"
            mv "$ckpt_dir/next_world.tmp" "$ckpt_dir/next_world"
        fi
        echo "link=$link rank=$rank size=$size" >>"$ckpt_dir/mock.ranks"
        exit 3 ;;
    wait)
        got=
        trap 'got=USR1' USR1
        trap 'got=TERM' TERM
        : >"$ckpt_dir/mock.ready.$link.$rank"
        waited=0
        while [ -z "$got" ] && [ $waited -lt $((timeout * 10)) ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        echo "link=$link rank=$rank size=$size signal=${got:-none}" >>"$ckpt_dir/mock.ranks"
        [ -z "$got" ] && { echo "mock-dynmo: no signal within $timeout s" >&2; exit 1; }
        # Like dynmo, a second signal does not interrupt the checkpoint.
        trap '' USR1 TERM
        sleep "$write_s"
        [ "$rank" = 0 ] && : >"$ckpt_dir/ckpt-$step.h5"
        echo "link=$link rank=$rank size=$size wrote" >>"$ckpt_dir/mock.ranks"
        exit 75 ;;
    exit:*)
        echo "link=$link rank=$rank size=$size" >>"$ckpt_dir/mock.ranks"
        exit "${action#exit:}" ;;
    done)
        echo "link=$link rank=$rank size=$size" >>"$ckpt_dir/mock.ranks"
        exit 0 ;;
    *)
        echo "mock-dynmo: no action for link $link in mock.plan=$plan" >&2
        exit 1 ;;
esac
