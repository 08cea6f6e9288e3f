// Reads and sets ATen's CUDA autocast dtype, which tch (0.26) does not
// expose: `tch::autocast` only toggles autocast, so without this CUDA
// autocast runs in ATen's default dtype, f16. Codes are `c10::ScalarType`
// values. Neither ATen function throws (they index a per-thread array).
#include <ATen/autocast_mode.h>

extern "C" {

int agl_cuda_autocast_dtype() {
  return static_cast<int>(at::autocast::get_autocast_dtype(at::kCUDA));
}

void agl_set_cuda_autocast_dtype(int dtype) {
  at::autocast::set_autocast_dtype(at::kCUDA,
                                   static_cast<at::ScalarType>(dtype));
}

}  // extern "C"
