#!/usr/bin/env bash
# The CUDA plugin (docs/gpu.md): `make USE_CUDA=1` builds it with nvcc
# (CUDA_HOME), it exports nothing but its entry, and dynmo loads it: on a
# machine without a GPU the run is refused with one message naming the
# missing device (exit 2); with a GPU, with the message that the model
# does not route through the backend yet. Skipped (77) without nvcc.
set -u
. "$(dirname "$0")/lib.sh"
if [ -z "${CUDA_HOME:-}" ]; then   # as the Makefile picks it
  CUDA_HOME=/usr; [ -x /usr/local/cuda/bin/nvcc ] && CUDA_HOME=/usr/local/cuda
fi
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "skipped: no nvcc at $CUDA_HOME/bin/nvcc (set CUDA_HOME; scripts/setup.sh installs nvidia-cuda-toolkit only where the archive has it)"
  exit 77
fi
plugin=$PWD/$BUILD/libdynmo_cuda.so
make --no-print-directory -s USE_CUDA=1 BUILD="$BUILD" SANITIZE="${SANITIZE:-}" CUDA_HOME="$CUDA_HOME" "$BUILD/libdynmo_cuda.so" \
  || { fail "make USE_CUDA=1 did not build $plugin"; finish; }
exported=$(nm -D --defined-only "$plugin" | awk '$2 == "T" {print $3}')
[ "$exported" = dynmo_cuda_backend_open ] || fail "the plugin exports more than its entry: $exported"
for kernel in gelu_forward_kernel gelu_backward_kernel residual_forward_kernel \
    layernorm_forward_kernel layernorm_backward_dinp_kernel layernorm_backward_params_kernel \
    attention_softmax_forward_kernel attention_softmax_backward_kernel attention_permute_kernel \
    crossentropy_forward_kernel crossentropy_backward_kernel adamw_update_kernel \
    encoder_forward_kernel encoder_backward_kernel rows_gather_kernel rows_scatter_kernel \
    matmul_init_kernel matmul_dbias_kernel sparse_forward_kernel sparse_dinp_kernel \
    sparse_dweight_kernel sparse_dbias_kernel mod_router_kernel mod_select_topk_kernel \
    hash_bucket_kernel \
    hash_order_kernel hash_tiles_kernel hash_forward_kernel hash_dq_kernel hash_dkv_kernel \
    mod_predictor_kernel mod_predictor_dweight_kernel exit_softmax_confidence_kernel \
    exit_saturation_confidence_kernel mod_combine_forward_kernel \
    mod_scale_chosen_kernel mod_combine_dr_kernel mod_combine_din_kernel \
    mod_combine_dweight_kernel moe_combine_forward_kernel moe_combine_dy_kernel \
    moe_combine_dgate_kernel moe_dispatch_backward_kernel precision_to_bf16_kernel; do
  nm -C "$plugin" | grep -q "$kernel(" || fail "kernel $kernel is not in the plugin"
done
for call in cublasGemmEx cublasGemmStridedBatchedEx ncclCommInitRankConfig ncclSend ncclRecv \
    ncclAllReduce cudaStreamQuery; do
  nm -D --undefined-only "$plugin" | grep -q " $call" || fail "the plugin does not call $call"
done

work_dir
tiny_config "$dir/run.ini" "run.out_dir=$dir/out" train.steps=1 > "$dir/run.ini"
if nvidia-smi -L >/dev/null 2>&1; then
  want="train.device = cuda: the CUDA backend opened \(CUDA device 0 .*does not run through it yet"
else
  want="train.device = cuda: $plugin: no CUDA device \(.*\); run on a GPU node or use train.device = cpu"
fi
expect_error "the built plugin" "$want" \
  env DYNMO_CUDA_PLUGIN="$plugin" "$DYNMO" train --config "$dir/run.ini" train.device=cuda
[ -e "$dir/out" ] && fail "run.out_dir created although the device was refused"
finish
