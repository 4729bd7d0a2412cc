// Fused CPU kernels of the SO(2) rotation path (accrot/ops/rotary.py has the eager formulas, the naive twins and the
// contract).
//
// Why: in eager PyTorch one pair rotation is four elementwise passes forward and six backward (with the angle
// gradient), and accumulating the angles is five more (float64 cast, cumsum along a strided axis, the wrap).
// On a CPU these passes, not the arithmetic, are most of what learned increments add to a training step.
// Each kernel below is one pass: the rotations over independent (b, h, t) rows, the scans over t per (b, h).
// Built for the baseline ISA without FMA contraction, so every machine of a cluster computes the same bits.
//
// Layout: x [B, H, T, D] pairs coordinate i with i + D/2; angles, cos, sin [B, H, T, D/2]
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

// A fresh output for a rotation of x: in x's memory order when x is dense; for a strided view of a [B, T, ·]
// buffer (q, k, v are slices of the [B, T, 3, H, D] projection), [B, T, H, D] memory, the order the rows are
// walked in (for_rows) and the one attention reads a projection's views in; else contiguous.
at::Tensor rotation_output(const at::Tensor& x) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  if (x.is_non_overlapping_and_dense()) return at::empty_like(x, at::MemoryFormat::Preserve);
  if (x.stride(2) > x.stride(1)) return at::empty({B, T, H, D}, x.options()).transpose(1, 2);
  return at::empty({B, H, T, D}, x.options());
}

// y_i = R(sθ) x_i per pair, (a, b) -> (a c - s b n, s a n + b c), for every x_i of xs (one shape and dtype), in
// one walk over the rows: cos and sin are read once for all of them (q and k share their angles).
std::vector<at::Tensor> rotate_many(at::TensorList xs, const at::Tensor& cos, const at::Tensor& sin, double sign) {
  TORCH_CHECK(!xs.empty(), "rotate_many needs at least one tensor");
  const at::Tensor& x0 = xs[0];
  check_rows(x0, "x");
  const int64_t B = x0.size(0), H = x0.size(1), T = x0.size(2), D = x0.size(3), P = D / 2;
  TORCH_CHECK(D % 2 == 0, "x's last dimension must be even");
  at::Tensor c = cos.expand({B, H, T, P}), n = sin.expand({B, H, T, P});
  check_rows(c, "cos");
  check_rows(n, "sin");
  std::vector<at::Tensor> ys;
  for (const at::Tensor& x : xs) {
    check_rows(x, "x");
    TORCH_CHECK(x.sizes() == x0.sizes() && x.scalar_type() == x0.scalar_type(), "xs must share one shape and dtype");
    ys.push_back(rotation_output(x));
  }
  TORCH_CHECK(c.scalar_type() == x0.scalar_type() && n.scalar_type() == x0.scalar_type(),
              "xs, cos and sin must share one dtype");
  AT_DISPATCH_FLOATING_TYPES(x0.scalar_type(), "accrot_rotate_many", [&] {
    const scalar_t s = static_cast<scalar_t>(sign);
    const Strided<const scalar_t> C(c.const_data_ptr<scalar_t>(), c), N(n.const_data_ptr<scalar_t>(), n);
    std::vector<Strided<const scalar_t>> X;
    std::vector<Strided<scalar_t>> Y;
    for (size_t i = 0; i < xs.size(); ++i) {
      X.emplace_back(xs[i].const_data_ptr<scalar_t>(), xs[i]);
      Y.emplace_back(ys[i].mutable_data_ptr<scalar_t>(), ys[i]);
    }
    for_rows(x0, B, H, T, [&](int64_t b, int64_t h, int64_t t) {
      const scalar_t *cr = C.at(b, h, t), *nr = N.at(b, h, t);
      for (size_t i = 0; i < X.size(); ++i) {
        const scalar_t* xr = X[i].at(b, h, t);
        scalar_t* yr = Y[i].at(b, h, t);
        rotate_row(xr, xr + P, cr, nr, yr, yr + P, P, s);
      }
    });
  });
  return ys;
}

// Backward of rotate_many: dx_i = R(-sθ) g_i (when want_dx) and, when ys is given, the angle gradient summed over
// the tensors, dθ = s Σ_i (y_i,a g_i,b - y_i,b g_i,a), [B, H, T, P] in g_0's row order: one pass and one dθ
// instead of one per tensor and their sum.
std::tuple<std::vector<at::Tensor>, at::Tensor> rotate_many_backward(at::TensorList grads, at::TensorList ys,
                                                                     const at::Tensor& cos, const at::Tensor& sin,
                                                                     double sign, bool want_dx) {
  TORCH_CHECK(!grads.empty(), "rotate_many_backward needs at least one gradient");
  const bool want_theta = !ys.empty();
  TORCH_CHECK(!want_theta || ys.size() == grads.size(), "ys must be empty or one per gradient");
  const at::Tensor& g0 = grads[0];
  check_rows(g0, "grad");
  const int64_t B = g0.size(0), H = g0.size(1), T = g0.size(2), D = g0.size(3), P = D / 2;
  at::Tensor c = cos.expand({B, H, T, P}), n = sin.expand({B, H, T, P});
  check_rows(c, "cos");
  check_rows(n, "sin");
  std::vector<at::Tensor> dxs;
  for (size_t i = 0; i < grads.size(); ++i) {
    check_rows(grads[i], "grad");
    TORCH_CHECK(grads[i].sizes() == g0.sizes() && grads[i].scalar_type() == g0.scalar_type(),
                "grads must share one shape and dtype");
    if (want_theta) {
      check_rows(ys[i], "y");
      TORCH_CHECK(ys[i].sizes() == g0.sizes(), "y and grad must have one shape");
    }
    if (want_dx) dxs.push_back(rotation_output(grads[i]));
  }
  at::Tensor dtheta = g0.stride(2) <= g0.stride(1) || !want_theta
                          ? at::empty({want_theta ? B : 0, H, T, P}, g0.options())
                          : at::empty({B, T, H, P}, g0.options()).transpose(1, 2);
  AT_DISPATCH_FLOATING_TYPES(g0.scalar_type(), "accrot_rotate_many_backward", [&] {
    const scalar_t s = static_cast<scalar_t>(sign);
    const Strided<const scalar_t> C(c.const_data_ptr<scalar_t>(), c), N(n.const_data_ptr<scalar_t>(), n);
    const Strided<scalar_t> DT(dtheta.mutable_data_ptr<scalar_t>(), dtheta);
    std::vector<Strided<const scalar_t>> G, Yo;
    std::vector<Strided<scalar_t>> DX;
    for (size_t i = 0; i < grads.size(); ++i) {
      G.emplace_back(grads[i].const_data_ptr<scalar_t>(), grads[i]);
      if (want_theta) Yo.emplace_back(ys[i].const_data_ptr<scalar_t>(), ys[i]);
      if (want_dx) DX.emplace_back(dxs[i].mutable_data_ptr<scalar_t>(), dxs[i]);
    }
    for_rows(g0, B, H, T, [&](int64_t b, int64_t h, int64_t t) {
      const scalar_t *cr = C.at(b, h, t), *nr = N.at(b, h, t);
      scalar_t* __restrict__ dt = want_theta ? DT.at(b, h, t) : nullptr;
      for (size_t i = 0; i < G.size(); ++i) {
        const scalar_t* gr = G[i].at(b, h, t);
        if (want_dx) {
          scalar_t* dxr = DX[i].at(b, h, t);
          rotate_row(gr, gr + P, cr, nr, dxr, dxr + P, P, -s);  // R(-sθ) g
        }
        if (want_theta) {
          const scalar_t *__restrict__ ya = Yo[i].at(b, h, t), *__restrict__ yb = ya + P, *__restrict__ ga = gr,
                                        *__restrict__ gb = gr + P;
          if (i == 0) {
            _Pragma("omp simd")
            for (int64_t p = 0; p < P; ++p) dt[p] = s * (ya[p] * gb[p] - yb[p] * ga[p]);
          } else {
            _Pragma("omp simd")
            for (int64_t p = 0; p < P; ++p) dt[p] += s * (ya[p] * gb[p] - yb[p] * ga[p]);
          }
        }
      }
    });
  });
  return {dxs, dtheta};
}

// θ_t = wrap(offset + Σ_{j≤t} δ_j) into theta [B, H, T, P], summed in float64 in the order torch.cumsum sums and
// wrapped to [-π, π): row(b, h, t) gives the increments of that row as a callable p -> δ_j[p] (a double), so the
// kernels that build δ on the fly (random draws, learned increments) share the sum and the wrap.
template <typename Row>
void wrapped_sums(const at::Tensor& theta, const double* po, Row row) {
  const int64_t B = theta.size(0), H = theta.size(1), T = theta.size(2), P = theta.size(3);
  const Strided<float> Th(theta.mutable_data_ptr<float>(), theta);
  for_head_runs(B, H, [&](int64_t b, int64_t h0, int64_t h1) {
    std::vector<double> sums((h1 - h0) * P, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = h0; h < h1; ++h) {
        const auto delta = row(b, h, t);
        const double* __restrict__ o = po ? po + (b * H + h) * P : nullptr;
        double* __restrict__ acc = sums.data() + (h - h0) * P;
        float* __restrict__ out = Th.at(b, h, t);
        _Pragma("omp simd")  // inside a macro argument, so not #pragma
        for (int64_t p = 0; p < P; ++p) {
          acc[p] += delta(p);
          const double v = (o ? acc[p] + o[p] : acc[p]) + kPi;
          out[p] = static_cast<float>(v - kTwoPi * std::floor(v * kInvTwoPi) - kPi);  // remainder, [-π, π)
        }
      }
    }
  });
}

// θ as float32 in x's memory order when x is dense (else contiguous)
at::Tensor angles_like(const at::Tensor& x) {
  at::Tensor theta = at::empty_like(x, x.options().dtype(at::kFloat), at::MemoryFormat::Preserve);
  return theta.stride(3) == 1 ? theta : at::empty(x.sizes(), theta.options());
}

// θ_t = wrap(offset + Σ_{j≤t} δ_j) along dimension 2 of δ [B, H, T, P] (any strides), summed in float64 in
// the order torch.cumsum sums, wrapped to [-π, π), written as float32 in δ's memory order when δ is dense.
at::Tensor accumulate_wrap(const at::Tensor& delta, const c10::optional<at::Tensor>& offset) {
  TORCH_CHECK(delta.dim() == 4 && delta.device().is_cpu(), "delta must be a 4-d CPU tensor [B, H, T, P]");
  const int64_t B = delta.size(0), H = delta.size(1), P = delta.size(3);
  at::Tensor d = delta.stride(3) == 1 ? delta : delta.contiguous();
  at::Tensor off;
  if (offset.has_value() && offset->defined()) off = offset->to(at::kDouble).expand({B, H, 1, P}).contiguous();
  at::Tensor theta = angles_like(d);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, d.scalar_type(), "accrot_accumulate_wrap", [&] {
    const Strided<const scalar_t> Dl(d.const_data_ptr<scalar_t>(), d);
    wrapped_sums(theta, off.defined() ? off.const_data_ptr<double>() : nullptr, [&](int64_t b, int64_t h, int64_t t) {
      const scalar_t* r = Dl.at(b, h, t);
      return [r](int64_t p) { return static_cast<double>(r[p]); };
    });
  });
  return theta;
}

// Random increments drawn as z and mapped in the same pass: δ_j = (mean + sigma · z_j) in float64, rounded to
// float32 (the bits of the eager (mean + sigma * z).to(float32)), then θ as accumulate_wrap. z [B, H, T, P]
// float32, any strides with a contiguous last dimension; mean, sigma [P] float64. No gradient (drawn, not learned).
at::Tensor accumulate_drawn(const at::Tensor& z, const at::Tensor& mean, const at::Tensor& sigma) {
  TORCH_CHECK(z.dim() == 4 && z.device().is_cpu() && z.scalar_type() == at::kFloat,
              "z must be a 4-d float32 CPU tensor [B, H, T, P]");
  const int64_t P = z.size(3);
  at::Tensor zz = z.stride(3) == 1 ? z : z.contiguous();
  at::Tensor mu = mean.to(at::kDouble).contiguous(), sd = sigma.to(at::kDouble).contiguous();
  TORCH_CHECK(mu.numel() == P && sd.numel() == P, "mean and sigma have one entry per pair");
  const double *pm = mu.const_data_ptr<double>(), *ps = sd.const_data_ptr<double>();
  at::Tensor theta = angles_like(zz);
  const Strided<const float> Z(zz.const_data_ptr<float>(), zz);
  wrapped_sums(theta, nullptr, [&](int64_t b, int64_t h, int64_t t) {
    const float* r = Z.at(b, h, t);
    return [r, pm, ps](int64_t p) { return static_cast<double>(static_cast<float>(pm[p] + ps[p] * static_cast<double>(r[p]))); };
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

// Learned increments in one pass each way. Forward: δ_j = scale · t_j (+ mean) (+ extra_j), t = tanh(u) (torch's
// vectorised tanh, computed by the caller), each step rounded to float32 as the eager formula rounds it, then
// θ = wrap(Σ_{j≤t} δ_j) summed in float64, as accumulate_wrap. t [B, H, T, P] any strides (last contiguous);
// scale, mean [P] float32; extra (a mixing floor's random increments) [B|1, H, T, P] float32. θ is float32 in
// t's memory order when t is dense.
at::Tensor accumulate_bounded(const at::Tensor& t, const at::Tensor& scale, const c10::optional<at::Tensor>& mean,
                              const c10::optional<at::Tensor>& extra) {
  check_rows(t, "t");
  TORCH_CHECK(t.scalar_type() == at::kFloat, "accumulate_bounded takes float32 t");
  const int64_t B = t.size(0), H = t.size(1), T = t.size(2), P = t.size(3);
  at::Tensor sc = scale.to(at::kFloat).contiguous();
  TORCH_CHECK(sc.numel() == P, "scale must have one entry per pair");
  at::Tensor mu, ex;
  if (mean.has_value() && mean->defined()) mu = mean->to(at::kFloat).contiguous();
  if (extra.has_value() && extra->defined()) {
    ex = extra->to(at::kFloat).expand({B, H, T, P});
    if (ex.stride(3) != 1 && P != 1) ex = ex.contiguous();
  }
  at::Tensor theta = at::empty_like(t, at::MemoryFormat::Preserve);
  if (theta.stride(3) != 1) theta = at::empty({B, H, T, P}, t.options());
  const Strided<const float> Tt(t.const_data_ptr<float>(), t);
  const float* ps = sc.const_data_ptr<float>();
  const float* pm = mu.defined() ? mu.const_data_ptr<float>() : nullptr;
  const bool has_extra = ex.defined();
  const Strided<const float> Ex(has_extra ? ex.const_data_ptr<float>() : nullptr, has_extra ? ex : t);
  wrapped_sums(theta, nullptr, [&](int64_t b, int64_t h, int64_t s) {
    const float* r = Tt.at(b, h, s);
    const float* e = has_extra ? Ex.at(b, h, s) : nullptr;
    return [r, e, ps, pm](int64_t p) {
      float d = r[p] * ps[p];
      if (pm) d = d + pm[p];
      if (e) d = d + e[p];
      return static_cast<double>(d);
    };
  });
  return theta;
}

// Backward of accumulate_bounded w.r.t. u: du_j = scale · (1 - t_j²) · Σ_{s≥j} g_s, the suffix sum accumulated in
// double (as suffix_sum), in t's memory order when t is dense (u's: the projection's backward then needs no copy).
at::Tensor accumulate_bounded_backward(const at::Tensor& grad, const at::Tensor& t, const at::Tensor& scale) {
  TORCH_CHECK(grad.dim() == 4 && grad.device().is_cpu(), "grad must be a 4-d CPU tensor [B, H, T, P]");
  check_rows(t, "t");
  const int64_t B = t.size(0), H = t.size(1), T = t.size(2), P = t.size(3);
  at::Tensor g = grad.to(at::kFloat).expand({B, H, T, P});
  if (g.stride(3) != 1 && P != 1) g = g.contiguous();
  at::Tensor sc = scale.to(at::kFloat).contiguous();
  at::Tensor du = at::empty_like(t, at::MemoryFormat::Preserve);
  if (du.stride(3) != 1) du = at::empty({B, H, T, P}, t.options());
  const Strided<const float> Gs(g.const_data_ptr<float>(), g), Tt(t.const_data_ptr<float>(), t);
  const Strided<float> O(du.mutable_data_ptr<float>(), du);
  const float* ps = sc.const_data_ptr<float>();
  for_head_runs(B, H, [&](int64_t b, int64_t h0, int64_t h1) {
    std::vector<double> sums((h1 - h0) * P, 0.0);
    for (int64_t s = T - 1; s >= 0; --s) {
      for (int64_t h = h0; h < h1; ++h) {
        const float* __restrict__ row = Gs.at(b, h, s);
        const float* __restrict__ tr = Tt.at(b, h, s);
        double* __restrict__ acc = sums.data() + (h - h0) * P;
        float* __restrict__ o = O.at(b, h, s);
        for (int64_t p = 0; p < P; ++p) {
          acc[p] += static_cast<double>(row[p]);
          const float suffix = static_cast<float>(acc[p]);
          o[p] = suffix * (ps[p] * (1.0f - tr[p] * tr[p]));
        }
      }
    }
  });
  return du;
}

}  // namespace

TORCH_LIBRARY(accrot_cpu, m) {
  m.def("accumulate_wrap(Tensor delta, Tensor? offset) -> Tensor");
  m.def("accumulate_drawn(Tensor z, Tensor mean, Tensor sigma) -> Tensor");
  m.def("suffix_sum(Tensor grad, int[]? strides) -> Tensor");
  m.def("rotate_many(Tensor[] xs, Tensor cos, Tensor sin, float sign) -> Tensor[]");
  m.def("rotate_many_backward(Tensor[] grads, Tensor[] ys, Tensor cos, Tensor sin, float sign, bool want_dx) -> (Tensor[], Tensor)");
  m.def("accumulate_bounded(Tensor t, Tensor scale, Tensor? mean, Tensor? extra) -> Tensor");
  m.def("accumulate_bounded_backward(Tensor grad, Tensor t, Tensor scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(accrot_cpu, CPU, m) {
  m.impl("accumulate_wrap", &accumulate_wrap);
  m.impl("accumulate_drawn", &accumulate_drawn);
  m.impl("suffix_sum", &suffix_sum);
  m.impl("rotate_many", &rotate_many);
  m.impl("rotate_many_backward", &rotate_many_backward);
  m.impl("accumulate_bounded", &accumulate_bounded);
  m.impl("accumulate_bounded_backward", &accumulate_bounded_backward);
}
