// The trainer's fused elementwise ops as autograd Functions, for
// `src/model/fused.rs`: the token logprob of a row of logits, SwiGLU's
// `silu(gate) * up`, and RMSNorm. The loops are `fused_kernels.cpp`; this
// file checks operands, allocates, and keeps what each backward needs
// (less than the composites keep: no `[N, V]` log-softmax, no `silu(gate)`,
// no normalised copy). f32 contiguous CPU tensors only (the caller checks
// device and dtype; strides are made contiguous here). Every entry point
// catches C++ exceptions and copies the message into `err` (returning
// null): nothing throws across the FFI boundary.
#include <exception>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "fused_kernels.h"
#include "shim_error.h"

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct TokenLogprobs : public torch::autograd::Function<TokenLogprobs> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, double scale) {
    TORCH_CHECK(logits.dim() == 2, "logits must be [N, V], got ", logits.sizes());
    TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0),
                "targets must be [N] for logits ", logits.sizes(), ", got ", targets.sizes());
    TORCH_CHECK(targets.scalar_type() == at::kLong, "targets must be int64");
    TORCH_CHECK(scale > 0.0, "the inverse temperature must be positive, got ", scale);
    auto x = logits.contiguous();
    auto t = targets.contiguous();
    const int64_t n = x.size(0), v = x.size(1);
    const int64_t* tp = t.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(tp[i] >= 0 && tp[i] < v, "target ", tp[i], " outside the vocabulary of ", v);
    }
    auto out = at::empty({n}, x.options());
    auto lse = at::empty({n}, x.options());
    agl_fused::token_logprobs_forward(x.const_data_ptr<float>(), tp, n, v, static_cast<float>(scale),
                                      out.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>());
    ctx->save_for_backward({x, t, lse});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    auto g = grads[0].contiguous();
    auto gx = at::empty_like(x);
    agl_fused::token_logprobs_backward(
        x.const_data_ptr<float>(), saved[1].const_data_ptr<int64_t>(), saved[2].const_data_ptr<float>(),
        g.const_data_ptr<float>(), x.size(0), x.size(1),
        static_cast<float>(ctx->saved_data["scale"].toDouble()), gx.mutable_data_ptr<float>());
    return {gx, at::Tensor(), at::Tensor()};
  }
};

struct SwiGlu : public torch::autograd::Function<SwiGlu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    TORCH_CHECK(gate.sizes() == up.sizes(), "gate ", gate.sizes(), " and up ", up.sizes(), " differ");
    auto g = gate.contiguous();
    auto u = up.contiguous();
    auto h = at::empty_like(g);
    agl_fused::swiglu_forward(g.const_data_ptr<float>(), u.const_data_ptr<float>(), g.numel(),
                              h.mutable_data_ptr<float>());
    ctx->save_for_backward({g, u});
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& g = saved[0];
    auto d = grads[0].contiguous();
    auto dg = at::empty_like(g);
    auto du = at::empty_like(g);
    agl_fused::swiglu_backward(g.const_data_ptr<float>(), saved[1].const_data_ptr<float>(),
                               d.const_data_ptr<float>(), g.numel(), dg.mutable_data_ptr<float>(),
                               du.mutable_data_ptr<float>());
    return {dg, du};
  }
};

struct RmsNorm : public torch::autograd::Function<RmsNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            double eps) {
    const int64_t h = weight.numel();
    TORCH_CHECK(weight.dim() == 1 && input.dim() >= 1 && input.size(-1) == h,
                "weight ", weight.sizes(), " does not match the last dim of ", input.sizes());
    auto x = input.contiguous();
    auto w = weight.contiguous();
    const int64_t n = h == 0 ? 0 : x.numel() / h;
    auto y = at::empty_like(x);
    auto rstd = at::empty({n}, x.options());
    agl_fused::rms_norm_forward(x.const_data_ptr<float>(), w.const_data_ptr<float>(), n, h,
                                static_cast<float>(eps), y.mutable_data_ptr<float>(),
                                rstd.mutable_data_ptr<float>());
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    auto d = grads[0].contiguous();
    const int64_t h = w.numel();
    const int64_t n = h == 0 ? 0 : x.numel() / h;
    auto gx = at::empty_like(x);
    at::Tensor gw;
    if (ctx->needs_input_grad(1)) gw = at::empty_like(w);
    agl_fused::rms_norm_backward(x.const_data_ptr<float>(), w.const_data_ptr<float>(),
                                 saved[2].const_data_ptr<float>(), d.const_data_ptr<float>(), n, h,
                                 gx.mutable_data_ptr<float>(),
                                 gw.defined() ? gw.mutable_data_ptr<float>() : nullptr);
    return {gx, gw, at::Tensor()};
  }
};

// Runs `f`, returning its tensor on the heap, or null with `err` set.
template <typename F>
at::Tensor* guarded(F f, char* err, size_t err_len) {
  try {
    return new at::Tensor(f());
  } catch (const std::exception& e) {
    agl_shim::report(e, err, err_len);
    return nullptr;
  }
}
}  // namespace

extern "C" {

bool agl_fused_supported() { return agl_fused::supported(); }

// `logits [N, V]`, `targets [N]` int64: `[N]` of
// `log_softmax(logits * scale)[i, targets[i]]`.
at::Tensor* agl_fused_token_logprobs(const at::Tensor* logits, const at::Tensor* targets,
                                     double scale, char* err, size_t err_len) {
  return guarded([&] { return TokenLogprobs::apply(*logits, *targets, scale); }, err, err_len);
}

// `silu(gate) * up`, both the same shape.
at::Tensor* agl_fused_swiglu(const at::Tensor* gate, const at::Tensor* up, char* err,
                             size_t err_len) {
  return guarded([&] { return SwiGlu::apply(*gate, *up); }, err, err_len);
}

// `weight * (x * rsqrt(mean(x^2, -1) + eps))`, `weight [H]`, `x [..., H]`.
at::Tensor* agl_fused_rms_norm(const at::Tensor* x, const at::Tensor* weight, double eps,
                               char* err, size_t err_len) {
  return guarded([&] { return RmsNorm::apply(*x, *weight, eps); }, err, err_len);
}

}  // extern "C"
