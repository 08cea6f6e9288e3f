// The fused loops (`fused_kernels.h`). Each reads its inputs once and
// writes its outputs once, where libtorch's composites make a pass (and
// often a temporary) per elementwise op. Built with `-mavx2 -mfma` on
// x86-64 (`build.rs`), so ATen's `Vectorized<float>` is its AVX2 one; the
// glue calls in only when `supported()` says the CPU has both. Threads come
// from `at::parallel_for`: libtorch's own OpenMP pool and thread count.
#include "fused_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace agl_fused {
namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t kW = Vec::size();
// libtorch's own grain (at::internal::GRAIN_SIZE), in elements.
constexpr int64_t kGrain = 32768;

// Rows per chunk so that a chunk holds about `kGrain` elements.
int64_t row_grain(int64_t width) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, width)); }

// `f(offset, count)` over `[0, n)` in vectors, the last one partial.
template <typename F>
inline void each_vec(int64_t n, const F& f) {
  int64_t j = 0;
  for (; j + kW <= n; j += kW) f(j, kW);
  if (j < n) f(j, n - j);
}

Vec sigmoid(const Vec& x) { return (x.neg().exp() + Vec(1.0f)).reciprocal(); }

}  // namespace

bool supported() {
#if defined(CPU_CAPABILITY_AVX2)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return true;
#endif
}

void token_logprobs_forward(const float* x, const int64_t* targets, int64_t n,
                            int64_t v, float scale, float* out, float* lse) {
  at::parallel_for(0, n, row_grain(v), [&](int64_t begin, int64_t end) {
    const Vec vscale(scale);
    for (int64_t i = begin; i < end; ++i) {
      const float* row = x + i * v;
      // scale > 0 (checked by the glue): max(x * scale) = max(x) * scale.
      Vec vmax(-std::numeric_limits<float>::infinity());
      int64_t j = 0;
      for (; j + kW <= v; j += kW) vmax = at::vec::maximum(vmax, Vec::loadu(row + j));
      float m = at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }, vmax);
      for (; j < v; ++j) m = std::max(m, row[j]);
      m *= scale;
      const Vec vm(m);
      Vec vsum(0.0f);
      for (j = 0; j + kW <= v; j += kW) {
        vsum = vsum + at::vec::fmsub(Vec::loadu(row + j), vscale, vm).exp();
      }
      float sum = at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, vsum);
      for (; j < v; ++j) sum += std::exp(row[j] * scale - m);
      const float l = m + std::log(sum);
      lse[i] = l;
      out[i] = row[targets[i]] * scale - l;
    }
  });
}

void token_logprobs_backward(const float* x, const int64_t* targets,
                             const float* lse, const float* g, int64_t n,
                             int64_t v, float scale, float* gx) {
  at::parallel_for(0, n, row_grain(v), [&](int64_t begin, int64_t end) {
    const Vec vscale(scale);
    for (int64_t i = begin; i < end; ++i) {
      const float* row = x + i * v;
      float* grow = gx + i * v;
      const float c = g[i] * scale;
      const Vec vl(lse[i]), vneg(-c);
      int64_t j = 0;
      for (; j + kW <= v; j += kW) {
        auto p = at::vec::fmsub(Vec::loadu(row + j), vscale, vl).exp();
        (p * vneg).store(grow + j);
      }
      for (; j < v; ++j) grow[j] = -c * std::exp(row[j] * scale - lse[i]);
      grow[targets[i]] += c;
    }
  });
}

void swiglu_forward(const float* gate, const float* up, int64_t n, float* h) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    each_vec(end - begin, [&](int64_t j, int64_t count) {
      const int64_t k = begin + j;
      auto g = Vec::loadu(gate + k, count);
      auto u = Vec::loadu(up + k, count);
      (g * sigmoid(g) * u).store(h + k, count);
    });
  });
}

void swiglu_backward(const float* gate, const float* up, const float* dh,
                     int64_t n, float* dgate, float* dup) {
  const Vec one(1.0f);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    each_vec(end - begin, [&](int64_t j, int64_t count) {
      const int64_t k = begin + j;
      auto g = Vec::loadu(gate + k, count);
      auto u = Vec::loadu(up + k, count);
      auto d = Vec::loadu(dh + k, count);
      auto s = sigmoid(g);
      auto silu = g * s;
      (d * silu).store(dup + k, count);
      // silu'(g) = s * (1 + g * (1 - s))
      (d * u * (s * (one + g * (one - s)))).store(dgate + k, count);
    });
  });
}

void rms_norm_forward(const float* x, const float* w, int64_t n, int64_t h,
                      float eps, float* y, float* rstd) {
  at::parallel_for(0, n, row_grain(h), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = x + i * h;
      Vec vss(0.0f);
      int64_t j = 0;
      for (; j + kW <= h; j += kW) {
        auto a = Vec::loadu(row + j);
        vss = at::vec::fmadd(a, a, vss);
      }
      float ss = at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, vss);
      for (; j < h; ++j) ss += row[j] * row[j];
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
      rstd[i] = r;
      const Vec vr(r);
      float* out = y + i * h;
      each_vec(h, [&](int64_t k, int64_t count) {
        (Vec::loadu(w + k, count) * (Vec::loadu(row + k, count) * vr)).store(out + k, count);
      });
    }
  });
}

void rms_norm_backward(const float* x, const float* w, const float* rstd,
                       const float* gy, int64_t n, int64_t h, float* gx,
                       float* gw) {
  // The weight's gradient sums over rows: each chunk of rows adds into a
  // row of its own, in f64 (a long f32 chain would lose bits that depend on
  // how rows are split into micro-batches), summed at the end.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  std::vector<double> partial(gw != nullptr ? chunks * h : 0, 0.0);
  const float inv_h = 1.0f / static_cast<float>(h);
  at::parallel_for(0, chunks, 1, [&](int64_t cbegin, int64_t cend) {
    for (int64_t c = cbegin; c < cend; ++c) {
      double* acc = gw != nullptr ? partial.data() + c * h : nullptr;
      for (int64_t i = n * c / chunks; i < n * (c + 1) / chunks; ++i) {
        const float* row = x + i * h;
        const float* grow = gy + i * h;
        const float r = rstd[i];
        // dot = sum(gy * w * x)
        Vec vdot(0.0f);
        int64_t j = 0;
        for (; j + kW <= h; j += kW) {
          vdot = at::vec::fmadd(Vec::loadu(grow + j) * Vec::loadu(w + j), Vec::loadu(row + j), vdot);
        }
        float dot = at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, vdot);
        for (; j < h; ++j) dot += grow[j] * w[j] * row[j];
        // gx = r * gy * w - (r^3 * dot / h) * x
        const Vec vr(r), vk(r * r * r * dot * inv_h);
        float* out = gx + i * h;
        each_vec(h, [&](int64_t k, int64_t count) {
          auto a = Vec::loadu(row + k, count);
          (vr * Vec::loadu(grow + k, count) * Vec::loadu(w + k, count) - vk * a).store(out + k, count);
        });
        if (acc != nullptr) {
          for (int64_t k = 0; k < h; ++k) acc[k] += static_cast<double>(grow[k] * (row[k] * r));
        }
      }
    }
  });
  if (gw == nullptr) return;
  for (int64_t j = 0; j < h; ++j) {
    double sum = 0.0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * h + j];
    gw[j] = static_cast<float>(sum);
  }
}

}  // namespace agl_fused
