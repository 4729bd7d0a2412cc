// The chunk loop of PaTH's CPU key walk (accrot/ops/path.py: _KeyWalk, _walk_forward, _PathWalk.backward are the
// eager twins, PATH.md §6-7 the derivation).
//
// Why: each query chunk is one fused flash-attention call, but between two calls the walk carries every earlier
// key across one chunk and slices, copies and accumulates a dozen small tensors. At training shapes (16 chunks of
// 32 tokens) those steps cost more in Python dispatch than in arithmetic; here they are the same ATen calls in a
// C++ loop. Nothing else changes: same buffers, same order of operations, same results as the eager loop.
//
// Layout: queries [N, BH, c, W] (chunk-start queries, then the bias's constant 1, then zeros up to W), values
// [BH, N*c, W] (v zero-padded), k_end [N, BH, c, D], Pt [N, BH, D, D] (P transposed per chunk), G [BH, N*c]
// float64 cumulative log2-decay and R [N, BH] float64 (G just before each chunk), both absent without a bias.
// A key buffer [BH, rows, W] holds K_n in its first n*c rows: D coordinates, then (bias) R_n - G_s, then zeros.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;

const double kLn2 = std::log(2.0);

struct KeyWalk {
  int64_t N, c, D, W;
  bool bias;
  Tensor values, k_end, Pt, G, R;
  Tensor keys;               // the buffer holding K_n (rows :n*c), undefined before the first step
  std::vector<Tensor> pool;  // two buffers of N*c rows used in turn by steps that are not fresh
  int64_t n = 0;

  KeyWalk(const Tensor& queries, const Tensor& values_, const Tensor& k_end_, const Tensor& Pt_,
          const std::optional<Tensor>& G_, const std::optional<Tensor>& R_)
      : N(queries.size(0)), c(queries.size(2)), D(k_end_.size(3)), W(queries.size(3)),
        bias(G_.has_value()), values(values_), k_end(k_end_), Pt(Pt_) {
    if (bias) {
      G = *G_;
      R = *R_;
    }
  }

  Tensor buffer(int64_t rows) const {
    Tensor buf = at::empty({values.size(0), rows, W}, values.options());
    if (W > D + bias) buf.narrow(2, D + bias, W - D - bias).zero_();  // zero columns pad q.k to the width
    return buf;
  }

  // K_{n+1} = [K_n Pt_n ; k_end_n]; returns the buffer's first (n+1)*c rows
  Tensor advance(bool fresh) {
    const int64_t next = n + 1, done = (next - 1) * c, rows = next * c;
    Tensor dst;
    if (fresh) {
      dst = buffer(rows);
    } else {
      if (pool.empty()) pool = {buffer(N * c), buffer(N * c)};
      dst = pool[keys.defined() && keys.is_same(pool[0]) ? 1 : 0];  // the one not being read
    }
    if (done) {
      Tensor out = dst.narrow(1, 0, done).narrow(2, 0, D);
      at::bmm_out(out, keys.narrow(1, 0, done).narrow(2, 0, D), Pt[next - 1]);
    }
    dst.narrow(1, done, c).narrow(2, 0, D).copy_(k_end[next - 1]);
    if (bias) {  // b_ts = a_t + (R_n - G_s): the key part (float64 difference, then cast)
      dst.narrow(1, 0, rows).select(2, D).copy_(R[next].unsqueeze(1) - G.narrow(1, 0, rows));
    }
    keys = dst;
    n = next;
    return dst.narrow(1, 0, rows);
  }

  // Set the walk to K_n (not copied: later steps from here are fresh); n = 1 without a buffer rebuilds K_1
  void restore(int64_t at_n, const std::optional<Tensor>& buf) {
    if (!buf) {
      n = 0;
      keys = Tensor();
      advance(true);
    } else {
      n = at_n;
      keys = *buf;
    }
  }
};

// -> the walk's output per query chunk n >= 1 [N-1, BH, c, W], its natural-unit log-sum-exp [N-1, BH, c] and
// the K_n buffers at n = 1 + keep, 1 + 2 keep, ... (none when keep is 0)
std::tuple<Tensor, Tensor, std::vector<Tensor>> path_walk_forward(
    const Tensor& queries, const Tensor& values, const Tensor& k_end, const Tensor& Pt,
    const std::optional<Tensor>& G, const std::optional<Tensor>& R, int64_t keep) {
  TORCH_CHECK(queries.dim() == 4 && values.dim() == 3 && k_end.dim() == 4 && Pt.dim() == 4,
              "path_walk_forward: queries [N, BH, c, W], values [BH, N*c, W], k_end [N, BH, c, D], Pt [N, BH, D, D]");
  TORCH_CHECK(G.has_value() == R.has_value(), "path_walk_forward: G and R come together");
  KeyWalk walk(queries, values, k_end, Pt, G, R);
  const int64_t N = walk.N, BH = queries.size(1), c = walk.c;
  Tensor outs = at::empty({std::max<int64_t>(N - 1, 0), BH, c, walk.W}, queries.options());
  Tensor lses = at::empty({std::max<int64_t>(N - 1, 0), BH, c}, queries.options());
  std::vector<Tensor> kept;
  for (int64_t n = 1; n < N; ++n) {
    const bool keep_n = keep > 0 && n > 1 && (n - 1) % keep == 0;
    Tensor keys = walk.advance(keep_n);
    if (keep_n) kept.push_back(keys);
    auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(
        queries[n].unsqueeze(0), keys.unsqueeze(0), values.narrow(1, 0, n * c).unsqueeze(0), 0.0, false,
        std::nullopt, kLn2);  // log2-unit logits times ln 2
    outs[n - 1].copy_(o[0]);
    lses[n - 1].copy_(l[0]);
  }
  return {outs, lses, kept};
}

// -> dq [N, BH, c, D], dk [N, BH, c, D], dPt [N, BH, D, D], dvalues [BH, N*c, Dv] and (bias) the column sums of
// the logit gradient [BH, N*c] (else an empty tensor). grad and out [N, BH, c, W] are zero-padded to W; lse is
// the flash op's own log-sum-exp (without a_t). kept / kept_at: the forward's buffers; seg: chunks per segment.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> path_walk_backward(
    const Tensor& queries, const Tensor& values, const Tensor& k_end, const Tensor& Pt,
    const std::optional<Tensor>& G, const std::optional<Tensor>& R, const Tensor& grad, const Tensor& out,
    const Tensor& lse, at::TensorList kept, at::IntArrayRef kept_at, int64_t seg, int64_t Dv) {
  TORCH_CHECK(kept.size() == kept_at.size(), "path_walk_backward: one position per kept buffer");
  TORCH_CHECK(seg >= 1, "path_walk_backward: seg must be positive");
  KeyWalk walk(queries, values, k_end, Pt, G, R);
  const int64_t N = walk.N, BH = queries.size(1), c = walk.c, D = walk.D;
  std::map<int64_t, Tensor> checkpoints;
  for (size_t i = 0; i < kept.size(); ++i) checkpoints[kept_at[i]] = kept[i];
  TORCH_CHECK(N >= 2, "path_walk_backward: the walk needs at least two chunks");
  // every row is written below except these: chunk 0 has no earlier keys, the last chunk passes none on
  Tensor dq = at::empty_like(k_end), dk = at::empty_like(k_end), dPt = at::empty_like(Pt);
  dq[0].zero_();
  dk[N - 1].zero_();
  dPt[0].zero_();
  dPt[N - 1].zero_();
  Tensor dvals = at::zeros({BH, N * c, Dv}, values.options());
  Tensor dcol = walk.bias ? at::zeros({BH, N * c}, values.options()) : at::empty({0}, values.options());
  std::map<int64_t, Tensor> snapshots;  // K_n of the segment being worked on
  Tensor A;                             // adjoint of K_{n+1}'s first D coordinates [BH, (n+1)*c, D]
  for (int64_t n = N - 1; n >= 1; --n) {
    if (!snapshots.count(n)) {  // rebuild segment [first, n]: K_first from its checkpoint, then walk on
      const int64_t first = 1 + (n - 1) / seg * seg;
      auto found = checkpoints.find(first);
      std::optional<Tensor> start;
      if (found != checkpoints.end()) {
        start = found->second;
        checkpoints.erase(found);
      }
      walk.restore(first, start);
      snapshots.clear();
      snapshots[first] = walk.keys;
      for (int64_t m = first + 1; m <= n; ++m) snapshots[m] = walk.advance(true);
    }
    Tensor K = snapshots[n];
    snapshots.erase(n);
    const int64_t rows = n * c;
    auto [dq_, dK, dV] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grad[n].unsqueeze(0), queries[n].unsqueeze(0), K.unsqueeze(0), values.narrow(1, 0, rows).unsqueeze(0),
        out[n].unsqueeze(0), lse[n].unsqueeze(0), 0.0, false, std::nullopt, kLn2);
    dq[n].copy_(dq_[0].narrow(-1, 0, D));
    dvals.narrow(1, 0, rows).add_(dV[0].narrow(-1, 0, Dv));
    Tensor dKn = dK[0];  // [BH, n*c, W]
    if (walk.bias) dcol.narrow(1, 0, rows).add_(dKn.select(-1, D));  // sum over t of dl_ts: the key part
    if (!A.defined()) {
      A = dKn.narrow(-1, 0, D);
    } else {  // K_{n+1} = [K_n Pt_n ; k_end_n]
      dk[n].copy_(A.narrow(1, rows, c));
      Tensor dPt_n = dPt[n];
      at::bmm_out(dPt_n, K.narrow(-1, 0, D).mT(), A.narrow(1, 0, rows));
      // into the flash op's own fresh dK: no new buffer per step
      A = dKn.narrow(-1, 0, D).baddbmm_(A.narrow(1, 0, rows), Pt[n].mT());
    }
  }
  dk[0].copy_(A.narrow(1, 0, c));  // K_1 = k_end_0
  return {dq, dk, dPt, dvals, dcol};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(accrot_cpu, m) {
  m.def("path_walk_forward(Tensor queries, Tensor values, Tensor k_end, Tensor Pt, Tensor? G, Tensor? R, "
        "int keep) -> (Tensor, Tensor, Tensor[])");
  m.def("path_walk_backward(Tensor queries, Tensor values, Tensor k_end, Tensor Pt, Tensor? G, Tensor? R, "
        "Tensor grad, Tensor out, Tensor lse, Tensor[] kept, int[] kept_at, int seg, int Dv) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(accrot_cpu, CPU, m) {
  m.impl("path_walk_forward", &path_walk_forward);
  m.impl("path_walk_backward", &path_walk_backward);
}
