// Fused CPU kernels of the SO(2) rotation path (accrot/ops/rotary.py has the eager twins and the contract).
//
// Why: in eager PyTorch one pair rotation is four elementwise passes forward and six backward (with the angle
// gradient), and accumulating the angles is five more (float64 cast, cumsum along a strided axis, the wrap).
// On a CPU these passes, not the arithmetic, are most of what learned increments add to a training step.
// Each kernel below is one pass: the rotations over independent (b, h, t) rows, the scans over t per (b, h).
// Built for the baseline ISA without FMA contraction, so every machine of a cluster computes the same bits.
//
// Layout (DESIGN §2): x [B, H, T, D] pairs coordinate i with i + D/2; angles, cos, sin [B, H, T, D/2]
// (broadcast dimensions arrive with stride 0). The last dimension is contiguous; the others may have any stride.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace {

constexpr double kPi = 3.14159265358979323846, kTwoPi = 2.0 * kPi, kInvTwoPi = 1.0 / kTwoPi;

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 4, name, " must be 4-d [B, H, T, *], got ", t.dim(), " dims");
  TORCH_CHECK(t.stride(3) == 1 || t.size(3) == 1, name, " must be contiguous in its last dimension");
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
}

template <typename scalar_t>
struct Strided {  // a [B, H, T, *] view: row (b, h, t) starts at ptr + b*sb + h*sh + t*st
  scalar_t* ptr;
  int64_t sb, sh, st;
  Strided(scalar_t* p, const at::Tensor& t) : ptr(p), sb(t.stride(0)), sh(t.stride(1)), st(t.stride(2)) {}
  scalar_t* at(int64_t b, int64_t h, int64_t t) const { return ptr + b * sb + h * sh + t * st; }
};

// Calls f(b, h, t) for every row of [B, H, T, *], in parallel, walking the rows in the memory order of `lead`:
// t inside h for [B, H, T, D] memory, h inside t for [B, T, H, D] memory (q, k, v are views of the [B, T, 3, H, D]
// projection and attention returns [B, T, H, D]). Walking t across a [B, T, H, D] tensor instead strides a page
// per few rows and ran 5-10x slower than the same arithmetic in memory order.
template <typename F>
void for_rows(const at::Tensor& lead, int64_t B, int64_t H, int64_t T, const F& f) {
  const bool t_inner = lead.stride(2) <= lead.stride(1);
  const int64_t outer = t_inner ? H : T, inner = t_inner ? T : H;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1));  // ~4096 rows per task
  at::parallel_for(0, B * outer, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / outer, o = i % outer;
      if (t_inner) {
        for (int64_t t = 0; t < inner; ++t) f(b, o, t);
      } else {
        for (int64_t h = 0; h < inner; ++h) f(b, h, o);
      }
    }
  });
}

// Calls f(b, h0, h1) for runs of heads of one batch row, in parallel: the scans below walk t in order for every
// (b, h) and keep one accumulator per head and pair, so they visit t outermost and the heads h0..h1-1 inside.
template <typename F>
void for_head_runs(int64_t B, int64_t H, const F& f) {
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {
      const int64_t b = i / H, h0 = i % H, h1 = std::min<int64_t>(H, h0 + (end - i));
      f(b, h0, h1);
      i += h1 - h0;
    }
  });
}

// One row of y = R(sθ) x: (a, b) -> (a c - s b n, s a n + b c).
template <typename scalar_t>
inline void rotate_row(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                       const scalar_t* __restrict__ c, const scalar_t* __restrict__ n, scalar_t* __restrict__ ya,
                       scalar_t* __restrict__ yb, int64_t P, scalar_t s) {
#pragma omp simd
  for (int64_t p = 0; p < P; ++p) {
    const scalar_t sn = s * n[p];
    ya[p] = a[p] * c[p] - b[p] * sn;
    yb[p] = a[p] * sn + b[p] * c[p];
  }
}

// y = R(sθ) x per pair: (a, b) -> (a c - s b n, s a n + b c). y keeps x's memory order when x is dense (the
// attention output arrives as [B, T, H, D] memory, and the output projection then reads it without a copy),
// else it is contiguous.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, double sign) {
  check_rows(x, "x");
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), P = D / 2;
  TORCH_CHECK(D % 2 == 0, "x's last dimension must be even");
  at::Tensor c = cos.expand({B, H, T, P}), n = sin.expand({B, H, T, P});
  check_rows(c, "cos");
  check_rows(n, "sin");
  TORCH_CHECK(c.scalar_type() == x.scalar_type() && n.scalar_type() == x.scalar_type(),
              "x, cos and sin must share one dtype");
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Preserve);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "accrot_rotate", [&] {
    const scalar_t s = static_cast<scalar_t>(sign);
    const Strided<const scalar_t> X(x.const_data_ptr<scalar_t>(), x), C(c.const_data_ptr<scalar_t>(), c),
        N(n.const_data_ptr<scalar_t>(), n);
    const Strided<scalar_t> Y(y.mutable_data_ptr<scalar_t>(), y);
    for_rows(x, B, H, T, [&](int64_t b, int64_t h, int64_t t) {
      const scalar_t* xr = X.at(b, h, t);
      scalar_t* yr = Y.at(b, h, t);
      rotate_row(xr, xr + P, C.at(b, h, t), N.at(b, h, t), yr, yr + P, P, s);
    });
  });
  return y;
}

// Backward of y = R(sθ) x from the output gradient g: dx = R(-sθ) g (when want_dx), and, when y is defined,
// dθ = s (y_a g_b - y_b g_a) per row, [B, H, T, P] (the caller sums broadcast dimensions). dx keeps grad's
// memory order when grad is dense.
std::tuple<at::Tensor, at::Tensor> rotate_backward(const at::Tensor& grad, const c10::optional<at::Tensor>& y,
                                                   const at::Tensor& cos, const at::Tensor& sin, double sign,
                                                   bool want_dx) {
  check_rows(grad, "grad");
  const int64_t B = grad.size(0), H = grad.size(1), T = grad.size(2), D = grad.size(3), P = D / 2;
  at::Tensor c = cos.expand({B, H, T, P}), n = sin.expand({B, H, T, P});
  check_rows(c, "cos");
  check_rows(n, "sin");
  const bool want_theta = y.has_value() && y->defined();
  at::Tensor out = want_theta ? *y : grad;
  if (want_theta) {
    check_rows(out, "y");
    TORCH_CHECK(out.sizes() == grad.sizes(), "y and grad must have one shape");
  }
  at::Tensor dx = want_dx ? at::empty_like(grad, at::MemoryFormat::Preserve) : at::empty({0, H, T, D}, grad.options());
  // dθ in grad's row order, so the summed angle gradient reaches the scans without a reordering copy
  at::Tensor dtheta = grad.stride(2) <= grad.stride(1) || !want_theta
                          ? at::empty({want_theta ? B : 0, H, T, P}, grad.options())
                          : at::empty({B, T, H, P}, grad.options()).transpose(1, 2);
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "accrot_rotate_backward", [&] {
    const scalar_t s = static_cast<scalar_t>(sign);
    const Strided<const scalar_t> G(grad.const_data_ptr<scalar_t>(), grad), C(c.const_data_ptr<scalar_t>(), c),
        N(n.const_data_ptr<scalar_t>(), n), Yo(out.const_data_ptr<scalar_t>(), out);
    const Strided<scalar_t> DX(dx.mutable_data_ptr<scalar_t>(), dx), DT(dtheta.mutable_data_ptr<scalar_t>(), dtheta);
    for_rows(grad, B, H, T, [&](int64_t b, int64_t h, int64_t t) {
      const scalar_t *gr = G.at(b, h, t), *cr = C.at(b, h, t), *nr = N.at(b, h, t);
      if (want_dx) {
        scalar_t* dxr = DX.at(b, h, t);
        rotate_row(gr, gr + P, cr, nr, dxr, dxr + P, P, -s);  // R(-sθ) g
      }
      if (want_theta) {
        const scalar_t *__restrict__ ya = Yo.at(b, h, t), *__restrict__ yb = ya + P, *__restrict__ ga = gr,
                                      *__restrict__ gb = gr + P;
        scalar_t* __restrict__ dt = DT.at(b, h, t);
        _Pragma("omp simd")  // inside a macro argument, so not #pragma
        for (int64_t p = 0; p < P; ++p) dt[p] = s * (ya[p] * gb[p] - yb[p] * ga[p]);
      }
    });
  });
  return {dx, dtheta};
}

// θ_t = wrap(offset + Σ_{j≤t} δ_j) along dimension 2 of δ [B, H, T, P] (any strides), summed in float64 in
// the order torch.cumsum sums, wrapped to [-π, π), written as float32 in δ's memory order when δ is dense.
at::Tensor accumulate_wrap(const at::Tensor& delta, const c10::optional<at::Tensor>& offset) {
  TORCH_CHECK(delta.dim() == 4 && delta.device().is_cpu(), "delta must be a 4-d CPU tensor [B, H, T, P]");
  const int64_t B = delta.size(0), H = delta.size(1), T = delta.size(2), P = delta.size(3);
  at::Tensor d = delta.stride(3) == 1 ? delta : delta.contiguous();
  at::Tensor off;
  if (offset.has_value() && offset->defined()) off = offset->to(at::kDouble).expand({B, H, 1, P}).contiguous();
  at::Tensor theta = at::empty_like(d, d.options().dtype(at::kFloat), at::MemoryFormat::Preserve);
  if (theta.stride(3) != 1) theta = at::empty({B, H, T, P}, theta.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, d.scalar_type(), "accrot_accumulate_wrap", [&] {
    const Strided<const scalar_t> Dl(d.const_data_ptr<scalar_t>(), d);
    const Strided<float> Th(theta.mutable_data_ptr<float>(), theta);
    const double* po = off.defined() ? off.const_data_ptr<double>() : nullptr;
    for_head_runs(B, H, [&](int64_t b, int64_t h0, int64_t h1) {
      std::vector<double> sums((h1 - h0) * P, 0.0);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = h0; h < h1; ++h) {
          const scalar_t* __restrict__ row = Dl.at(b, h, t);
          const double* __restrict__ o = po ? po + (b * H + h) * P : nullptr;
          double* __restrict__ acc = sums.data() + (h - h0) * P;
          float* __restrict__ out = Th.at(b, h, t);
          _Pragma("omp simd")  // inside a macro argument, so not #pragma
          for (int64_t p = 0; p < P; ++p) {
            acc[p] += static_cast<double>(row[p]);
            const double v = (o ? acc[p] + o[p] : acc[p]) + kPi;
            out[p] = static_cast<float>(v - kTwoPi * std::floor(v * kInvTwoPi) - kPi);  // remainder, [-π, π)
          }
        }
      }
    });
  });
  return theta;
}

// Suffix sums along dimension 2: d δ_j = Σ_{t≥j} g_t, [B, H, T, P] in g's dtype, accumulated in double as
// torch.cumsum does on the CPU (so the result equals grad.flip(2).cumsum(2).flip(2)). With ``strides`` the
// result has them (the increments' own layout, so their backward needs no copy), else it is contiguous.
at::Tensor suffix_sum(const at::Tensor& grad, at::OptionalIntArrayRef strides) {
  TORCH_CHECK(grad.dim() == 4 && grad.device().is_cpu(), "grad must be a 4-d CPU tensor [B, H, T, P]");
  const int64_t B = grad.size(0), H = grad.size(1), T = grad.size(2), P = grad.size(3);
  at::Tensor g = grad.stride(3) == 1 ? grad : grad.contiguous();
  at::Tensor out = strides.has_value() ? at::empty_strided({B, H, T, P}, *strides, g.options())
                                       : at::empty({B, H, T, P}, g.options());
  TORCH_CHECK(out.stride(3) == 1, "suffix_sum: the result's last dimension must be contiguous");
  AT_DISPATCH_FLOATING_TYPES(g.scalar_type(), "accrot_suffix_sum", [&] {
    const Strided<const scalar_t> Gs(g.const_data_ptr<scalar_t>(), g);
    const Strided<scalar_t> O(out.mutable_data_ptr<scalar_t>(), out);
    for_head_runs(B, H, [&](int64_t b, int64_t h0, int64_t h1) {
      std::vector<double> sums((h1 - h0) * P, 0.0);
      for (int64_t t = T - 1; t >= 0; --t) {
        for (int64_t h = h0; h < h1; ++h) {
          const scalar_t* __restrict__ row = Gs.at(b, h, t);
          double* __restrict__ acc = sums.data() + (h - h0) * P;
          scalar_t* __restrict__ o = O.at(b, h, t);
          _Pragma("omp simd")  // inside a macro argument, so not #pragma
          for (int64_t p = 0; p < P; ++p) {
            acc[p] += static_cast<double>(row[p]);
            o[p] = static_cast<scalar_t>(acc[p]);
          }
        }
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(accrot_cpu, m) {
  m.def("rotate(Tensor x, Tensor cos, Tensor sin, float sign) -> Tensor");
  m.def("rotate_backward(Tensor grad, Tensor? y, Tensor cos, Tensor sin, float sign, bool want_dx) -> (Tensor, Tensor)");
  m.def("accumulate_wrap(Tensor delta, Tensor? offset) -> Tensor");
  m.def("suffix_sum(Tensor grad, int[]? strides) -> Tensor");
}

TORCH_LIBRARY_IMPL(accrot_cpu, CPU, m) {
  m.impl("rotate", &rotate);
  m.impl("rotate_backward", &rotate_backward);
  m.impl("accumulate_wrap", &accumulate_wrap);
  m.impl("suffix_sum", &suffix_sum);
}
