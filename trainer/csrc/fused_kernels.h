// The loops of the trainer's fused elementwise ops (`fused_kernels.cpp`,
// built for AVX2 on x86-64), on raw contiguous f32 buffers. The autograd
// glue around them is `fused.cpp`, built like the other shims: only this
// header crosses between the two, so no tensor code is compiled for an ISA
// the CPU may lack.
#pragma once

#include <cstdint>

namespace agl_fused {

// Whether this CPU runs the loops (AVX2 and FMA where they were built so).
bool supported();

// Per row `i` of `x` `[n, v]`, with `z = x * scale`: `lse[i] =
// logsumexp(z[i])` and `out[i] = z[i, targets[i]] - lse[i]`.
void token_logprobs_forward(const float* x, const int64_t* targets, int64_t n,
                            int64_t v, float scale, float* out, float* lse);

// `gx[i, j] = g[i] * scale * ([j == targets[i]] - exp(z[i, j] - lse[i]))`.
void token_logprobs_backward(const float* x, const int64_t* targets,
                             const float* lse, const float* g, int64_t n,
                             int64_t v, float scale, float* gx);

// `h = silu(gate) * up` over `n` elements.
void swiglu_forward(const float* gate, const float* up, int64_t n, float* h);

// The gradients of `swiglu_forward` for `dh`: `dgate`, `dup`.
void swiglu_backward(const float* gate, const float* up, const float* dh,
                     int64_t n, float* dgate, float* dup);

// Per row of `x` `[n, h]`: `rstd = (mean(x^2) + eps)^-1/2`, `y = w * (x *
// rstd)`.
void rms_norm_forward(const float* x, const float* w, int64_t n, int64_t h,
                      float eps, float* y, float* rstd);

// The gradients of `rms_norm_forward` for `gy`: `gx`, and `gw` (`[h]`,
// summed over rows) unless it is null.
void rms_norm_backward(const float* x, const float* w, const float* rstd,
                       const float* gy, int64_t n, int64_t h, float* gx,
                       float* gw);

}  // namespace agl_fused
