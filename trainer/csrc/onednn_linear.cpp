// `y = x W^T` for f32 on the CPU through oneDNN, with its own backward
// (an autograd Function), for `src/model/onednn_linear.rs`. libtorch sends
// f32 `mm` on the CPU to MKL, whose kernels on AMD cores are AVX2 ones
// (`sgemm_kernel_0_zen`); oneDNN, which libtorch also ships, dispatches on
// the ISA alone and runs AVX-512 there: ~2x the GFLOP/s on the trainer's
// shapes. Every entry point catches C++ exceptions and copies the message
// into `err` (returning null): nothing throws across the FFI boundary.
#include <exception>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "shim_error.h"

namespace at::native {
// Exported by libtorch_cpu (TORCH_API) but its header is not in the wheel:
// result = beta * result + alpha * mat1 @ mat2, strided operands allowed.
void mkldnn_matmul(const Tensor& mat1, const Tensor& mat2,
                   const Tensor& result, float beta, float alpha);
}  // namespace at::native

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// `a [m, k] @ b [k, n]` into a new contiguous `[m, n]`.
at::Tensor onednn_mm(const at::Tensor& a, const at::Tensor& b) {
  auto out = at::empty({a.size(0), b.size(1)}, a.options());
  at::native::mkldnn_matmul(a, b, out, 0.0f, 1.0f);
  return out;
}

struct Linear : public torch::autograd::Function<Linear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    // Only what a gradient needs, as libtorch's `mm` keeps it: a frozen
    // weight (LoRA's base) keeps no activation alive.
    ctx->save_for_backward({w.requires_grad() ? x : at::Tensor(),
                            x.requires_grad() ? w : at::Tensor()});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    auto rows = x.reshape({-1, x.size(-1)});
    auto shape = x.sizes().vec();
    shape.back() = w.size(0);
    return onednn_mm(rows, w.t()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    auto x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    // The incoming gradient may be any view (an expand from a sum's
    // backward): one copy makes it a plain matrix.
    auto g = grads[0].reshape({-1, grads[0].size(-1)}).contiguous();
    at::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) gx = onednn_mm(g, w).view(x_sizes);
    if (ctx->needs_input_grad(1)) gw = onednn_mm(g.t(), x.reshape({-1, x.size(-1)}));
    return {gx, gw};
  }
};

}  // namespace

extern "C" {

// `x [..., in]`, `w [out, in]`, both f32 on the CPU (checked by the
// caller): a new tensor `[..., out]`, on autograd's graph when either
// input requires grad; null with `err` set on failure.
at::Tensor* agl_onednn_linear(const at::Tensor* x, const at::Tensor* w,
                              char* err, size_t err_len) {
  try {
    return new at::Tensor(Linear::apply(*x, *w));
  } catch (const std::exception& e) {
    agl_shim::report(e, err, err_len);
    return nullptr;
  }
}

}  // extern "C"
