# Shared by the emulated-device tests (t_emulated_device.sh,
# t_device_memory.sh, t_device_transport.sh): 20-step runs and their
# losses. Source after lib.sh and work_dir.

# run NAME RANKS [key=value...]: a 20-step run into $dir/NAME, its losses in
# $dir/NAME.steps.loss (lib.sh's bits); with $strict set,
# DYNMO_EMULATE_STRICT=$strict (else the environment's, the emulator's
# default: strict)
run() {
  local name=$1 ranks=$2; shift 2
  tiny_config "$dir/$name.ini" "run.out_dir=$dir/$name" train.steps=20 "$@" > "$dir/$name.ini"
  ${strict:+env DYNMO_EMULATE_STRICT=$strict} timeout -k 10 180 mpiexec -n "$ranks" "$DYNMO" train \
    --config "$dir/$name.ini" > "$dir/$name.out" 2>&1 \
    || { fail "$name: exit $?: $(grep -m3 -i 'error\|host read' "$dir/$name.out" ||
                                  tail -n 3 "$dir/$name.out")"; return 1; }
  bits "$name" /steps/loss
}

# close A B [LAST]: the losses of A and B (the last LAST of B against A's
# tail) within 1e-4 relative; prints the largest difference
close() {
  python3 - "$dir/$1.steps.loss" "$dir/$2.steps.loss" "${3:-0}" <<'PY'
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read(); last = int(sys.argv[3])
fa = struct.unpack('<%df' % (len(a) // 4), a); fb = struct.unpack('<%df' % (len(b) // 4), b)
if last: fa, fb = fa[-last:], fb[-last:]
if len(fa) != len(fb) or not fa: print('lengths %d %d' % (len(fa), len(fb))); sys.exit(1)
worst = max(abs(x - y) / abs(x) for x, y in zip(fa, fb))
print('%d losses, largest relative difference %.2e' % (len(fa), worst)); sys.exit(worst > 1e-4)
PY
}
