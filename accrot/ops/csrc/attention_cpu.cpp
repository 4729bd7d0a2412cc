// The block loop of the far-mass CPU kernel (accrot/ops/attention.py: eager_key_bias_forward and
// eager_key_bias_backward are the eager twins, the module docstring the derivation).
//
// Why: each query block is two fused flash calls (the keys before it, then its causal diagonal tile), and between
// them the loop slices, merges by log-sum-exp and accumulates a dozen tensors. At training shapes (8 blocks of
// 128 rows) those steps cost about 1.5 ms per layer in Python dispatch; here they are the same ATen calls in a
// C++ loop, in the same order, so the results are the eager loop's bits.
//
// Layout: q, k, v [B, H, T, D] (any strides with a unit last one), c [B|1, H, T] float64 cumulative log f; the
// backward's augmented operands qa = [q, √D], ka = [k, ·] (its last coordinate is filled here per block), va =
// [v, 0], oa = [out, 0], ga = [grad, 0], all [B, H, T, D + 1].

#include <ATen/ATen.h>
#include <torch/library.h>

#include "subnormals.h"

#include <algorithm>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;

// c_t0 - c_s for s < t1, cast to dtype: the key part of block [t0, t1)'s bias, [B|1, H, t1]
Tensor key_bias(const Tensor& c, int64_t t0, int64_t t1, at::ScalarType dtype) {
  return (c.narrow(2, t0, 1) - c.narrow(2, 0, t1)).to(dtype);
}

// -> out [B, H, T, D] and the natural-unit log-sum-exp [B, H, T] (scale: the caller's D^-1/2, so both loops use
// the same double)
std::tuple<Tensor, Tensor> key_bias_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& c,
                                            int64_t blk, double scale) {
  accrot::FlushSubnormals flush;  // subnormals.h: this call's threads, restored on exit
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && c.dim() == 3, "key_bias_forward: q, k, v [B, H, T, D], c [B|1, H, T]");
  TORCH_CHECK(blk >= 1, "key_bias_forward: blk must be positive");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2);
  Tensor out = at::empty_like(q), lse = at::empty({B, H, T}, q.options());
  for (int64_t t0 = 0; t0 < T; t0 += blk) {
    const int64_t t1 = std::min(t0 + blk, T), n = t1 - t0;
    Tensor col = key_bias(c, t0, t1, q.scalar_type()).unsqueeze(-2);  // [B|1, H, 1, t1]
    Tensor qb = q.narrow(2, t0, n);
    // the diagonal tile (causal), then the keys before it
    auto [mo, ml] = at::_scaled_dot_product_flash_attention_for_cpu(
        qb, k.narrow(2, t0, n), v.narrow(2, t0, n), 0.0, true, col.narrow(3, t0, n), scale);
    if (t0 > 0) {  // softmax over the union of two key sets, from each set's normalised output and LSE
      auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(
          qb, k.narrow(2, 0, t0), v.narrow(2, 0, t0), 0.0, false, col.narrow(3, 0, t0), scale);
      Tensor both = at::logaddexp(ml, l);  // [B, H, n]
      mo = mo.mul_((ml - both).exp_().unsqueeze(-1));
      mo.add_(o.mul_((l - both).exp_().unsqueeze(-1)));
      ml = both;
    }
    out.narrow(2, t0, n).copy_(mo);
    lse.narrow(2, t0, n).copy_(ml);
  }
  return {out, lse};
}

// -> dqa, dka, dva [B, H, T, D + 1] (token-major in memory: the order of the fused backward's own results, so the
// copies and sums run along memory). Every row is written before it is added to: query block t0's diagonal tile
// comes first and assigns its rows (and its keys' rows); the keys before t0 were assigned by their own block.
// ka's last coordinate is overwritten per block (c_t0 - c_s).
std::tuple<Tensor, Tensor, Tensor> key_bias_backward(const Tensor& ga, const Tensor& qa, const Tensor& ka,
                                                     const Tensor& va, const Tensor& oa, const Tensor& lse,
                                                     const Tensor& c, int64_t blk, double scale) {
  accrot::FlushSubnormals flush;  // subnormals.h: this call's threads, restored on exit
  TORCH_CHECK(qa.dim() == 4 && ka.sizes() == qa.sizes() && va.sizes() == qa.sizes() && c.dim() == 3,
              "key_bias_backward: augmented q, k, v [B, H, T, D + 1], c [B|1, H, T]");
  TORCH_CHECK(blk >= 1, "key_bias_backward: blk must be positive");
  const int64_t B = qa.size(0), H = qa.size(1), T = qa.size(2), W = qa.size(3), D = W - 1;
  auto token_major = [&](const Tensor& x) { return at::empty({B, T, H, W}, x.options()).transpose(1, 2); };
  Tensor dqa = token_major(qa), dka = token_major(ka), dva = token_major(va);
  Tensor bias_slot = ka.select(3, D);  // [B, H, T]
  for (int64_t t0 = 0; t0 < T; t0 += blk) {
    const int64_t t1 = std::min(t0 + blk, T), n = t1 - t0;
    bias_slot.narrow(2, 0, t1).copy_(key_bias(c, t0, t1, ka.scalar_type()));  // c_t0 - c_s, keys of this block
    Tensor g = ga.narrow(2, t0, n), qb = qa.narrow(2, t0, n), ob = oa.narrow(2, t0, n), lb = lse.narrow(2, t0, n);
    // each part's share of the gradient, from the merged output and LSE (its softmax weights are exp(score -
    // merged LSE), exactly its entries of the full softmax)
    auto [dq_, dk_, dv_] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        g, qb, ka.narrow(2, t0, n), va.narrow(2, t0, n), ob, lb, 0.0, true, std::nullopt, scale);
    dqa.narrow(2, t0, n).copy_(dq_);
    dka.narrow(2, t0, n).copy_(dk_);
    dva.narrow(2, t0, n).copy_(dv_);
    if (t0 > 0) {
      auto [dq2, dk2, dv2] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          g, qb, ka.narrow(2, 0, t0), va.narrow(2, 0, t0), ob, lb, 0.0, false, std::nullopt, scale);
      dqa.narrow(2, t0, n).add_(dq2);
      dka.narrow(2, 0, t0).add_(dk2);
      dva.narrow(2, 0, t0).add_(dv2);
    }
  }
  return {dqa, dka, dva};
}

// Whether subnormals are flushed (1) or IEEE (0) in each thread of the calling thread's OpenMP team, thread 0
// first: what the guard of subnormals.h must leave as it found it (tests/ops/test_subnormals.py).
std::vector<int64_t> flush_modes() {
  std::vector<int64_t> modes(omp_in_parallel() ? 1 : omp_get_max_threads(), -1);
#pragma omp parallel num_threads(static_cast<int>(modes.size()))
  modes[omp_get_thread_num()] = (accrot::float_mode() & accrot::kFlushBits) == accrot::kFlushBits && accrot::kFlushBits;
  return modes;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(accrot_cpu, m) {
  m.def("flush_modes() -> int[]", &flush_modes);  // no tensor argument, no dispatch key: a catch-all
  m.def("key_bias_forward(Tensor q, Tensor k, Tensor v, Tensor c, int blk, float scale) -> (Tensor, Tensor)");
  m.def("key_bias_backward(Tensor ga, Tensor qa, Tensor ka, Tensor va, Tensor oa, Tensor lse, Tensor c, int blk, "
        "float scale) "
        "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(accrot_cpu, CPU, m) {
  m.impl("key_bias_forward", &key_bias_forward);
  m.impl("key_bias_backward", &key_bias_backward);
}
