// The chunk loop of PaTH's CPU key walk (accrot/ops/path/key_walk.py: eager_path_walk_forward and
// eager_path_walk_backward are the eager twins, PATH.md §6-7 the derivation), and below it the chunk core
// (accrot/ops/path/chunk.py: _ChunkCore's eager branch is its twin, PATH.md §7).
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
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "subnormals.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

// The BLAS that torch itself calls (MKL in the x86 wheels; weak, so a torch without it still loads this library
// and the chunk core falls back to plain loops) and MKL's per-thread thread count (absent elsewhere).
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*) __attribute__((weak));
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));
}

namespace {

using at::Tensor;

const double kLn2 = std::log(2.0);

template <typename T>
void blas_gemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const T* alpha,
               const T* a, const int* lda, const T* b, const int* ldb, const T* beta, T* c, const int* ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm_) return sgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    if (dgemm_) return dgemm_(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  // no BLAS symbol: the column-major product in plain loops
  const bool tA = *ta == 'T', tB = *tb == 'T';
  for (int j = 0; j < *n; ++j)
    for (int i = 0; i < *m; ++i) {
      T acc = 0;
      for (int p = 0; p < *k; ++p)
        acc += (tA ? a[p + i * *lda] : a[i + p * *lda]) * (tB ? b[j + p * *ldb] : b[p + j * *ldb]);
      c[i + j * *ldc] = *alpha * acc + (*beta == T(0) ? T(0) : *beta * c[i + j * *ldc]);
    }
}

// row-major C[m, n] = alpha op(A) op(B) + beta C with op(A) [m, k], op(B) [k, n] and row strides lda, ldb, ldc of
// the matrices as stored (A is [k, m] when transposed): the column-major call on the transposes
template <typename T>
inline void mm(bool ta, const T* A, int lda, bool tb, const T* B, int ldb, T* C, int ldc, int m, int n, int k,
               T alpha = 1, T beta = 0) {
  const char ca = ta ? 'T' : 'N', cb = tb ? 'T' : 'N';
  blas_gemm<T>(&cb, &ca, &n, &m, &k, &alpha, B, &ldb, A, &lda, &beta, C, &ldc);
}

// copy a [rows, cols] block between row strides
template <typename T>
inline void put(T* dst, int ldd, const T* src, int lds, int rows, int cols) {
  for (int r = 0; r < rows; ++r) std::copy(src + r * lds, src + r * lds + cols, dst + r * ldd);
}

// BLAS inside at::parallel_for: one thread per call (restored afterwards)
struct SerialBlas {
  int previous = 0;
  SerialBlas() { if (MKL_Set_Num_Threads_Local) previous = MKL_Set_Num_Threads_Local(1); }
  ~SerialBlas() { if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(previous); }
};

template <typename T>
void batched_mm_impl(const Tensor& A, bool ta, const Tensor& B, bool tb, const Tensor& C, int m, int n, int k,
                     T beta) {
  const T *a0 = A.data_ptr<T>(), *b0 = B.data_ptr<T>();
  T* c0 = C.data_ptr<T>();
  const int64_t sa = A.stride(0), sb = B.stride(0), sc = C.stride(0);
  const int lda = A.stride(1), ldb = B.stride(1), ldc = C.stride(1);
  at::parallel_for(0, C.size(0), 1, [&](int64_t lo, int64_t hi) {
    SerialBlas serial;
    for (int64_t b = lo; b < hi; ++b)
      mm<T>(ta, a0 + b * sa, lda, tb, b0 + b * sb, ldb, c0 + b * sc, ldc, m, n, k, T(1), beta);
  });
}

// per batch b: C_b = op(A_b) op(B_b) + beta C_b on 3-d views [BH, ·, ·] with unit last stride, row-major, one BLAS
// call per batch. Why not at::bmm_out / baddbmm_: the walk's operands are row ranges of wider buffers (not
// contiguous as a whole), for which ATen splits the batch into one addmm_ dispatch per matrix (about twice the time
// at training shapes)
void batched_mm(const Tensor& A, bool ta, const Tensor& B, bool tb, const Tensor& C, int64_t m, int64_t n, int64_t k,
                double beta) {
  TORCH_CHECK(A.dim() == 3 && B.dim() == 3 && C.dim() == 3 && A.stride(2) == 1 && B.stride(2) == 1 &&
                  C.stride(2) == 1 && A.size(0) == C.size(0) && B.size(0) == C.size(0),
              "batched_mm: 3-d operands with unit last stride and one batch size");
  TORCH_CHECK(A.scalar_type() == C.scalar_type() && B.scalar_type() == C.scalar_type(), "batched_mm: one dtype");
  if (C.scalar_type() == at::kFloat) {
    batched_mm_impl<float>(A, ta, B, tb, C, m, n, k, static_cast<float>(beta));
  } else {
    TORCH_CHECK(C.scalar_type() == at::kDouble, "batched_mm: float32 or float64");
    batched_mm_impl<double>(A, ta, B, tb, C, m, n, k, beta);
  }
}

// One step of the key walk for every head b, each head's whole step on one thread (the thread that wrote K_n's
// rows of that head in the last step, and whose flash call reads them next: the partition over heads is ATen's):
// dst[:done, :D] = keys[:done, :D] Pt (BLAS), dst[done:rows, :D] = k_end, and with a bias its key part R_n - G_s
// (float64 difference, then one cast: the bits of the eager (R - G).to(dtype)) into coordinate D when column, and
// times ln 2 into mask [BH, rows] when given. As separate ATen calls the copies ran on the other core's lines.
template <typename T>
void advance_impl(const Tensor& keys, const Tensor& Pt, const Tensor& k_end, const Tensor& dst, const Tensor& G,
                  const Tensor& Rn, const Tensor& mask, int64_t done, int64_t rows, int64_t D, bool column) {
  const int64_t BH = dst.size(0), c = rows - done;
  const bool bias = G.defined(), masked = mask.defined();
  const T *kp = done ? keys.data_ptr<T>() : nullptr, *pp = Pt.data_ptr<T>(), *ep = k_end.data_ptr<T>();
  T *dp = dst.data_ptr<T>(), *mp = masked ? mask.data_ptr<T>() : nullptr;
  const double *gp = bias ? G.data_ptr<double>() : nullptr, *rp = bias ? Rn.data_ptr<double>() : nullptr;
  const int64_t ksb = done ? keys.stride(0) : 0, ldk = done ? keys.stride(1) : 0, psb = Pt.stride(0);
  const int64_t ldp = Pt.stride(1), esb = k_end.stride(0), lde = k_end.stride(1), dsb = dst.stride(0);
  const int64_t ldd = dst.stride(1), gsb = bias ? G.stride(0) : 0, gs = bias ? G.stride(1) : 0;
  const int64_t rs = bias ? Rn.stride(0) : 0, msb = masked ? mask.stride(0) : 0;
  at::parallel_for(0, BH, 1, [&](int64_t lo, int64_t hi) {
    SerialBlas serial;
    for (int64_t b = lo; b < hi; ++b) {
      T* d = dp + b * dsb;
      if (done) mm<T>(false, kp + b * ksb, ldk, false, pp + b * psb, ldp, d, ldd, done, D, D, T(1), T(0));
      for (int64_t r = 0; r < c; ++r) std::copy(ep + b * esb + r * lde, ep + b * esb + r * lde + D, d + (done + r) * ldd);
      if (!bias) continue;
      const double R_b = rp[b * rs];
      const double* g = gp + b * gsb;
      if (column)
        for (int64_t s = 0; s < rows; ++s) d[s * ldd + D] = static_cast<T>(R_b - g[s * gs]);
      if (masked)
        for (int64_t s = 0; s < rows; ++s) mp[b * msb + s] = static_cast<T>((R_b - g[s * gs]) * kLn2);
    }
  });
}

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

  // K_{n+1} = [K_n Pt_n ; k_end_n]; returns the buffer's first (n+1)*c rows. column: write the bias into
  // coordinate D (a forward that passes it as a mask skips it on the buffers it does not keep); mask (defined,
  // [BH, rows]): write it there, times ln 2, as well
  Tensor advance(bool fresh, bool column = true, const Tensor& mask = Tensor()) {
    const int64_t next = n + 1, done = (next - 1) * c, rows = next * c;
    Tensor dst;
    if (fresh) {
      dst = buffer(rows);
    } else {
      if (pool.empty()) pool = {buffer(N * c), buffer(N * c)};
      dst = pool[keys.defined() && keys.is_same(pool[0]) ? 1 : 0];  // the one not being read
    }
    TORCH_CHECK(dst.stride(2) == 1 && k_end.stride(3) == 1 && Pt.stride(3) == 1, "the walk's rows have unit stride");
    Tensor Rn = bias ? R[next] : Tensor(), Gr = bias ? G.narrow(1, 0, rows) : Tensor();
    AT_DISPATCH_FLOATING_TYPES(dst.scalar_type(), "path_walk_advance", [&] {
      advance_impl<scalar_t>(keys, Pt[next - 1], k_end[next - 1], dst, Gr, Rn, mask, done, rows, D, column);
    });
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

// -> the walk's output per query chunk n >= 1 [N-1, BH, c, W or D], its natural-unit log-sum-exp [N-1, BH, c] and
// the K_n buffers at n = 1 + keep, 1 + 2 keep, ... (none when keep is 0). With a bias and Dv <= D each flash call
// runs at head size D with the bias as a broadcast [1, BH, 1, rows] mask (times ln 2: the mask is added after the
// scale), which costs less than the extra coordinate; the kept buffers still get the coordinate, for the backward.
std::tuple<Tensor, Tensor, std::vector<Tensor>> path_walk_forward(
    const Tensor& queries, const Tensor& values, const Tensor& k_end, const Tensor& Pt,
    const std::optional<Tensor>& G, const std::optional<Tensor>& R, int64_t keep, int64_t Dv) {
  accrot::FlushSubnormals flush;  // subnormals.h: this call's threads, restored on exit
  TORCH_CHECK(queries.dim() == 4 && values.dim() == 3 && k_end.dim() == 4 && Pt.dim() == 4,
              "path_walk_forward: queries [N, BH, c, W], values [BH, N*c, W], k_end [N, BH, c, D], Pt [N, BH, D, D]");
  TORCH_CHECK(G.has_value() == R.has_value(), "path_walk_forward: G and R come together");
  KeyWalk walk(queries, values, k_end, Pt, G, R);
  const int64_t N = walk.N, BH = queries.size(1), c = walk.c;
  const bool masked = walk.bias && Dv <= walk.D;
  const int64_t width = masked ? walk.D : walk.W;  // the flash calls' head size
  Tensor outs = at::empty({std::max<int64_t>(N - 1, 0), BH, c, width}, queries.options());
  Tensor lses = at::empty({std::max<int64_t>(N - 1, 0), BH, c}, queries.options());
  std::vector<Tensor> kept;
  for (int64_t n = 1; n < N; ++n) {
    const bool keep_n = keep > 0 && n > 1 && (n - 1) % keep == 0;
    Tensor m = masked ? at::empty({BH, n * c}, queries.options()) : Tensor();
    Tensor keys = walk.advance(keep_n, !masked || keep_n, m);
    if (keep_n) kept.push_back(keys);
    std::optional<Tensor> mask;
    if (masked) mask = m.unsqueeze(1).unsqueeze(0);  // [1, BH, 1, rows]
    auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(
        queries[n].narrow(-1, 0, width).unsqueeze(0), keys.narrow(-1, 0, width).unsqueeze(0),
        values.narrow(1, 0, n * c).narrow(-1, 0, width).unsqueeze(0), 0.0, false, mask,
        kLn2);  // log2-unit logits times ln 2
    outs[n - 1].copy_(o[0]);
    lses[n - 1].copy_(l[0]);
  }
  return {outs, lses, kept};
}

// One flash backward's results into the walk's gradients, one pass per head: dq_n = dq[..., :D], dvals[:, :rows] +=
// dV[..., :Dv] and (bias, dcol defined) dcol[:, :rows] += dK[..., D], the sum over t of dl_ts, the gradient of the
// bias's key part. The same additions as the eager loop's add_ calls; ATen makes three strided passes of them.
template <typename T>
void take_step_impl(const Tensor& dq, const Tensor& dq_, const Tensor& dvals, const Tensor& dV, const Tensor& dcol,
                    const Tensor& dK, int64_t D, int64_t Dv) {
  const int64_t BH = dV.size(0), rows = dV.size(1), c = dq.size(1);
  const bool bias = dcol.numel() > 0;
  T *q = dq.data_ptr<T>(), *vals = dvals.data_ptr<T>(), *col = bias ? dcol.data_ptr<T>() : nullptr;
  const T *q_ = dq_.data_ptr<T>(), *v = dV.data_ptr<T>(), *k = dK.data_ptr<T>();
  const int64_t qb = dq.stride(0), qr = dq.stride(1), q_b = dq_.stride(0), q_r = dq_.stride(1);
  const int64_t ab = dvals.stride(0), ar = dvals.stride(1), vb = dV.stride(0), vr = dV.stride(1);
  const int64_t cb = bias ? dcol.stride(0) : 0, kb = dK.stride(0), kr = dK.stride(1);
  // by heads, split as ATen's flash backward splits them: each head's gradients are read by the core that wrote them
  at::parallel_for(0, BH, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      for (int64_t t = 0; t < c; ++t) std::copy(q_ + b * q_b + t * q_r, q_ + b * q_b + t * q_r + D, q + b * qb + t * qr);
      T* acc = vals + b * ab;
      const T* src = v + b * vb;
      for (int64_t s = 0; s < rows; ++s)
        for (int64_t j = 0; j < Dv; ++j) acc[s * ar + j] += src[s * vr + j];
      if (bias)
        for (int64_t s = 0; s < rows; ++s) col[b * cb + s] += k[b * kb + s * kr + D];
    }
  });
}

void take_step(const Tensor& dq, const Tensor& dq_, const Tensor& dvals, const Tensor& dV, const Tensor& dcol,
               const Tensor& dK, int64_t D, int64_t Dv) {
  TORCH_CHECK(dq.stride(2) == 1 && dq_.stride(2) == 1 && dvals.stride(2) == 1 && dV.stride(2) == 1 &&
                  dK.stride(2) == 1 && (dcol.numel() == 0 || dcol.stride(1) == 1),
              "take_step: unit last strides");
  AT_DISPATCH_FLOATING_TYPES(dq.scalar_type(), "take_step", [&] {
    take_step_impl<scalar_t>(dq, dq_, dvals, dV, dcol, dK, D, Dv);
  });
}

// -> dq [N, BH, c, D], dk [N, BH, c, D], dPt [N, BH, D, D], dvalues [BH, N*c, Dv] and (bias) the column sums of
// the logit gradient [BH, N*c] (else an empty tensor). grad and out [N, BH, c, W] are zero-padded to W; lse is
// the flash op's own log-sum-exp (without a_t). kept / kept_at: the forward's buffers; seg: chunks per segment.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> path_walk_backward(
    const Tensor& queries, const Tensor& values, const Tensor& k_end, const Tensor& Pt,
    const std::optional<Tensor>& G, const std::optional<Tensor>& R, const Tensor& grad, const Tensor& out,
    const Tensor& lse, at::TensorList kept, at::IntArrayRef kept_at, int64_t seg, int64_t Dv) {
  accrot::FlushSubnormals flush;  // subnormals.h: this call's threads, restored on exit
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
    Tensor dKn = dK[0];  // [BH, n*c, W]
    take_step(dq[n], dq_[0], dvals, dV[0], dcol, dKn, D, Dv);
    if (!A.defined()) {
      A = dKn.narrow(-1, 0, D);
    } else {  // K_{n+1} = [K_n Pt_n ; k_end_n]
      dk[n].copy_(A.narrow(1, rows, c));
      batched_mm(K, true, A, false, dPt[n], D, D, rows, 0.0);  // dPt_n = K_nᵀ A (first D columns, rows :rows)
      // A <- dK_n + A Pt_nᵀ, into the flash op's own fresh dK: no new buffer per step
      batched_mm(A, false, Pt[n], true, dKn, rows, D, D, 1.0);
      A = dKn.narrow(-1, 0, D);
    }
  }
  dk[0].copy_(A.narrow(1, 0, c));  // K_1 = k_end_0
  return {dq, dk, dPt, dvals, dcol};
}


// ---- the chunk core (accrot/ops/path/chunk.py: _ChunkCore is the eager twin, PATH.md §1-2 and §7 the algebra) ----
//
// Why: per chunk the UT transform and the diagonal block are a dozen products of 32 x 32 matrices. As batched
// ATen calls each product is a pass over every chunk's operands in memory (fresh [N, BH, c, c] tensors, masks,
// negations); here one chunk at a time stays in cache, and the products that share an operand are one larger
// GEMM on stacked blocks: 4 GEMMs forward (10 as batched calls) and 10 backward (20). Each thread runs its chunks
// with single-threaded BLAS (the chunks are the parallelism).
//
// Layout (row-major, per chunk i of the N*BH): q, k, w [c, D] (q scaled), b [c]; s [c, c] (-inf above the
// diagonal), q_start, k_end [c, D], Pt [D, D]; the backward's operands T = L^-1 [c, c], U [c, D], Y [c, c], QW [c, c].

template <typename T>
void core_forward_impl(const Tensor& qb, const Tensor& kb, const Tensor& wb, const Tensor& bb, const Tensor& s_,
                       const Tensor& qs_, const Tensor& ke_, const Tensor& Pt_, const Tensor& Ti_, const Tensor& U_,
                       const Tensor& Y_, const Tensor& QW_, bool save) {
  const int64_t chunks = qb.size(0) * qb.size(1);
  const int c = qb.size(2), D = qb.size(3), E = D + c, c2 = 2 * c;
  const T *q0 = qb.data_ptr<T>(), *k0 = kb.data_ptr<T>(), *w0 = wb.data_ptr<T>(), *b0 = bb.data_ptr<T>();
  T *s0 = s_.data_ptr<T>(), *qs0 = qs_.data_ptr<T>(), *ke0 = ke_.data_ptr<T>(), *P0 = Pt_.data_ptr<T>();
  T *Ti0 = save ? Ti_.data_ptr<T>() : nullptr, *U0 = save ? U_.data_ptr<T>() : nullptr;
  T *Y0 = save ? Y_.data_ptr<T>() : nullptr, *QW0 = save ? QW_.data_ptr<T>() : nullptr;
  const T ninf = -std::numeric_limits<T>::infinity();
  at::parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    SerialBlas serial;
    // scratch: XQ = [X; Q] and WK = [W; K] [2c, D], G = XQ WKᵀ [2c, 2c], Tm [c, c], R = [X | WK] and
    // M = T R = [U | Y] [c, D + c], C2 [c, D + c], C3 [D + c, D], QWm [c, c]
    std::vector<T> buf(2 * c2 * D + c2 * c2 + c * c + 3 * c * E + E * D + c * c);
    T *XQ = buf.data(), *WK = XQ + c2 * D, *G = WK + c2 * D, *Tm = G + c2 * c2, *R = Tm + c * c, *M = R + c * E;
    T *C2 = M + c * E, *C3 = C2 + c * E, *QWm = C3 + E * D;
    for (int64_t i = lo; i < hi; ++i) {
      const T *q = q0 + i * c * D, *k = k0 + i * c * D, *w = w0 + i * c * D, *b = b0 + i * c;
      for (int r = 0; r < c; ++r)
        for (int d = 0; d < D; ++d) XQ[r * D + d] = w[r * D + d] * b[r];  // X: rows β_j w_j
      std::copy(q, q + c * D, XQ + c * D);
      std::copy(w, w + c * D, WK);
      std::copy(k, k + c * D, WK + c * D);
      // G = [X Wᵀ, X Kᵀ; Q Wᵀ, Q Kᵀ]: L's strict lower part, WK (j > s), QW (i <= t) and QKᵀ in one product
      mm<T>(false, XQ, D, true, WK, D, G, c2, c2, c2, D);
      // T = L⁻¹, L = I + strict(X Wᵀ) unit lower triangular: row r = e_r - sum_{j<r} L_rj T_j
      for (int r = 0; r < c; ++r) {
        T* row = Tm + r * c;
        std::fill(row, row + c, T(0));
        row[r] = 1;
        for (int j = 0; j < r; ++j) {
          const T l = G[r * c2 + j];
          const T* tj = Tm + j * c;
          for (int p = 0; p <= j; ++p) row[p] -= l * tj[p];
        }
      }
      for (int r = 0; r < c; ++r) {  // R = [X | strict(X Kᵀ)], QWm = lower(Q Wᵀ)
        std::copy(XQ + r * D, XQ + (r + 1) * D, R + r * E);
        for (int p = 0; p < c; ++p) {
          R[r * E + D + p] = p < r ? G[r * c2 + c + p] : T(0);
          QWm[r * c + p] = p <= r ? G[(c + r) * c2 + p] : T(0);
        }
      }
      mm<T>(false, Tm, c, false, R, E, M, E, c, E, c);  // [U | Y] = T [X | WK]
      for (int r = 0; r < c; ++r) {  // C2 = [Q | Q Kᵀ] - QW [U | Y] = [q̂ | S]
        std::copy(q + r * D, q + (r + 1) * D, C2 + r * E);
        std::copy(G + (c + r) * c2 + c, G + (c + r) * c2 + c2, C2 + r * E + D);
      }
      mm<T>(false, QWm, c, false, M, E, C2, E, c, E, c, T(-1), T(1));
      for (int r = 0; r < D; ++r)  // C3 = [I; K] - [U | Y]ᵀ W = [Pᵀ; k̂]
        for (int p = 0; p < D; ++p) C3[r * D + p] = r == p;
      std::copy(k, k + c * D, C3 + D * D);
      mm<T>(true, M, E, false, w, D, C3, D, E, D, c, T(-1), T(1));
      T *sd = s0 + i * c * c;
      put(qs0 + i * c * D, D, C2, E, c, D);
      put(sd, c, C2 + D, E, c, c);
      for (int r = 0; r < c; ++r) std::fill(sd + r * c + r + 1, sd + (r + 1) * c, ninf);
      std::copy(C3, C3 + D * D, P0 + i * D * D);
      std::copy(C3 + D * D, C3 + E * D, ke0 + i * c * D);
      if (save) {
        std::copy(Tm, Tm + c * c, Ti0 + i * c * c);
        put(U0 + i * c * D, D, M, E, c, D);
        put(Y0 + i * c * c, c, M + D, E, c, c);
        std::copy(QWm, QWm + c * c, QW0 + i * c * c);
      }
    }
  });
}

// -> s [N, BH, c, c], q_start, k_end [N, BH, c, D], Pt [N, BH, D, D] and, when save, the backward's T, U, Y, QW
// (else empty tensors)
std::vector<Tensor> path_core_forward(const Tensor& qb, const Tensor& kb, const Tensor& wb, const Tensor& bb,
                                      bool save) {
  accrot::FlushSubnormals flush;  // subnormals.h: this call's threads, restored on exit
  TORCH_CHECK(qb.dim() == 4 && kb.sizes() == qb.sizes() && wb.sizes() == qb.sizes() && bb.dim() == 3 &&
                  bb.sizes() == qb.sizes().slice(0, 3),
              "path_core_forward: q, k, w [N, BH, c, D] and b [N, BH, c]");
  const int64_t N = qb.size(0), BH = qb.size(1), c = qb.size(2), D = qb.size(3);
  const auto o = qb.options();
  Tensor q = qb.contiguous(), k = kb.contiguous().to(o), w = wb.contiguous().to(o), b = bb.contiguous().to(o);
  Tensor s = at::empty({N, BH, c, c}, o), qs = at::empty_like(q), ke = at::empty_like(q);
  Tensor Pt = at::empty({N, BH, D, D}, o), none = at::empty({0}, o);
  Tensor Ti = save ? at::empty({N, BH, c, c}, o) : none, U = save ? at::empty_like(q) : none;
  Tensor Y = save ? at::empty({N, BH, c, c}, o) : none, QW = save ? at::empty({N, BH, c, c}, o) : none;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "path_core_forward", [&] {
    core_forward_impl<scalar_t>(q, k, w, b, s, qs, ke, Pt, Ti, U, Y, QW, save);
  });
  return {s, qs, ke, Pt, Ti, U, Y, QW};
}

template <typename T>
void core_backward_impl(const Tensor& ds_, const Tensor& dqs_, const Tensor& dke_, const Tensor& dPt_,
                        const Tensor& qb, const Tensor& kb, const Tensor& wb, const Tensor& bb, const Tensor& Ti_,
                        const Tensor& U_, const Tensor& Y_, const Tensor& QW_, const Tensor& dq_, const Tensor& dk_,
                        const Tensor& dw_, const Tensor& db_) {
  const int64_t chunks = qb.size(0) * qb.size(1);
  const int c = qb.size(2), D = qb.size(3), E = D + c, c2 = 2 * c;
  const T *q0 = qb.data_ptr<T>(), *k0 = kb.data_ptr<T>(), *w0 = wb.data_ptr<T>(), *b0 = bb.data_ptr<T>();
  const T *Ti0 = Ti_.data_ptr<T>(), *U0 = U_.data_ptr<T>(), *Y0 = Y_.data_ptr<T>(), *QW0 = QW_.data_ptr<T>();
  const T *ds0 = ds_.data_ptr<T>(), *dqs0 = dqs_.data_ptr<T>(), *dke0 = dke_.data_ptr<T>(), *dPt0 = dPt_.data_ptr<T>();
  T *dq0 = dq_.data_ptr<T>(), *dk0 = dk_.data_ptr<T>(), *dw0 = dw_.data_ptr<T>(), *db0 = db_.data_ptr<T>();
  at::parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    SerialBlas serial;
    // scratch: M = [U | Y], Gq = [dq̂ | dS], dUY, dXR [c, D + c]; Ep = [dPᵀ; dk̂] [D + c, D]; XQ = [X; Q],
    // WK = [W; K] [2c, D]; P1 = [dA | dWK], P2 = [dQW | dS] [c, 2c]; P3 = [dWK; dS], P4 = [dA; dQW] [2c, c]; dX [c, D]
    std::vector<T> buf(4 * c * E + E * D + 2 * c2 * D + 4 * c * c2 + c * D);
    T *M = buf.data(), *Gq = M + c * E, *dUY = Gq + c * E, *dXR = dUY + c * E, *Ep = dXR + c * E;
    T *XQ = Ep + E * D, *WK = XQ + c2 * D, *P1 = WK + c2 * D, *P2 = P1 + c * c2, *P3 = P2 + c * c2;
    T *P4 = P3 + c2 * c, *dX = P4 + c2 * c;
    for (int64_t i = lo; i < hi; ++i) {
      const T *q = q0 + i * c * D, *k = k0 + i * c * D, *w = w0 + i * c * D, *b = b0 + i * c;
      const T *Tm = Ti0 + i * c * c, *QW = QW0 + i * c * c, *ds = ds0 + i * c * c;
      const T *dqs = dqs0 + i * c * D, *dke = dke0 + i * c * D;
      T *dq = dq0 + i * c * D, *dk = dk0 + i * c * D, *dw = dw0 + i * c * D, *db = db0 + i * c;
      put(M, E, U0 + i * c * D, D, c, D);
      put(M + D, E, Y0 + i * c * c, c, c, c);
      put(Gq, E, dqs, D, c, D);
      for (int r = 0; r < c; ++r)  // dS: the −inf entries above the diagonal carry no gradient
        for (int p = 0; p < c; ++p) {
          const T g = p <= r ? ds[r * c + p] : T(0);
          Gq[r * E + D + p] = g;
          P2[r * c2 + c + p] = g;
          P3[(c + r) * c + p] = g;
        }
      std::copy(dPt0 + i * D * D, dPt0 + (i + 1) * D * D, Ep);
      std::copy(dke, dke + c * D, Ep + D * D);
      for (int r = 0; r < c; ++r)
        for (int d = 0; d < D; ++d) XQ[r * D + d] = w[r * D + d] * b[r];
      std::copy(q, q + c * D, XQ + c * D);
      std::copy(w, w + c * D, WK);
      std::copy(k, k + c * D, WK + c * D);
      // q̂ = Q − QW U, k̂ = K − Yᵀ W, S = QKᵀ − QW Y, Pᵀ = I − Uᵀ W:
      // dQW = −lower([dq̂ | dS] [U | Y]ᵀ), [dU | dY] = −QWᵀ [dq̂ | dS] − W [dPᵀ; dk̂]ᵀ, dW = −[U | Y] [dPᵀ; dk̂]
      T* dQW = P2;  // [c, 2c] left half
      mm<T>(false, Gq, E, true, M, E, dQW, c2, c, c, E, T(-1));
      for (int r = 0; r < c; ++r) std::fill(dQW + r * c2 + r + 1, dQW + r * c2 + c, T(0));
      mm<T>(true, QW, c, false, Gq, E, dUY, E, c, E, c, T(-1));
      mm<T>(false, w, D, true, Ep, D, dUY, E, c, E, D, T(-1), T(1));
      mm<T>(false, M, E, false, Ep, D, dw, D, c, D, E, T(-1));
      // [U | Y] = T [X | WK] with L T = I: [dX | dR] = Tᵀ [dU | dY], dL = −strict([dX | dR] [U | Y]ᵀ) =: dA
      mm<T>(true, Tm, c, false, dUY, E, dXR, E, c, E, c);
      T* dA = P1;  // [c, 2c] left half
      mm<T>(false, dXR, E, true, M, E, dA, c2, c, c, E, T(-1));
      for (int r = 0; r < c; ++r) {
        std::fill(dA + r * c2 + r, dA + r * c2 + c, T(0));
        for (int p = 0; p < c; ++p) {
          const T g = p < r ? dXR[r * E + D + p] : T(0);  // dWK = strict(dR)
          P1[r * c2 + c + p] = g;
          P3[r * c + p] = g;
          P4[r * c + p] = dA[r * c2 + p];
          P4[(c + r) * c + p] = dQW[r * c2 + p];
        }
      }
      // L = I + X Wᵀ, WK = X Kᵀ, QW = Q Wᵀ, S ∋ Q Kᵀ:
      // dX += [dA | dWK] [W; K], dQ = dq̂ + [dQW | dS] [W; K], dK = dk̂ + [dWK; dS]ᵀ [X; Q], dW += [dA; dQW]ᵀ [X; Q] + dX β
      put(dX, D, dXR, E, c, D);
      mm<T>(false, P1, c2, false, WK, D, dX, D, c, D, c2, T(1), T(1));
      std::copy(dqs, dqs + c * D, dq);
      mm<T>(false, P2, c2, false, WK, D, dq, D, c, D, c2, T(1), T(1));
      std::copy(dke, dke + c * D, dk);
      mm<T>(true, P3, c, false, XQ, D, dk, D, c, D, c2, T(1), T(1));
      mm<T>(true, P4, c, false, XQ, D, dw, D, c, D, c2, T(1), T(1));
      for (int r = 0; r < c; ++r) {
        T acc = 0;
        for (int d = 0; d < D; ++d) {
          dw[r * D + d] += dX[r * D + d] * b[r];
          acc += dX[r * D + d] * w[r * D + d];
        }
        db[r] = acc;
      }
    }
  });
}

// -> dq, dk, dw [N, BH, c, D], db [N, BH, c] from the output gradients and path_core_forward's saved tensors
std::vector<Tensor> path_core_backward(const Tensor& ds, const Tensor& dq_start, const Tensor& dk_end,
                                       const Tensor& dPt, const Tensor& qb, const Tensor& kb, const Tensor& wb,
                                       const Tensor& bb, const Tensor& Ti, const Tensor& U, const Tensor& Y,
                                       const Tensor& QW) {
  accrot::FlushSubnormals flush;  // subnormals.h: this call's threads, restored on exit
  const int64_t c = qb.size(2), D = qb.size(3);
  TORCH_CHECK(Ti.numel() > 0 && Ti.size(-1) == c && U.sizes() == qb.sizes() && dPt.size(-1) == D,
              "path_core_backward: the forward's saved tensors (save=True) and its output gradients");
  const auto o = qb.options();
  auto in = [&](const Tensor& x) { return x.contiguous().to(o); };
  Tensor q = in(qb), k = in(kb), w = in(wb), b = in(bb), T_ = in(Ti), U_ = in(U), Y_ = in(Y), QW_ = in(QW);
  Tensor ds_ = in(ds), dqs = in(dq_start), dke = in(dk_end), dPt_ = in(dPt);
  Tensor dq = at::empty_like(q), dk = at::empty_like(q), dw = at::empty_like(q), db = at::empty_like(b);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "path_core_backward", [&] {
    core_backward_impl<scalar_t>(ds_, dqs, dke, dPt_, q, k, w, b, T_, U_, Y_, QW_, dq, dk, dw, db);
  });
  return {dq, dk, dw, db};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(accrot_cpu, m) {
  m.def("path_walk_forward(Tensor queries, Tensor values, Tensor k_end, Tensor Pt, Tensor? G, Tensor? R, "
        "int keep, int Dv) -> (Tensor, Tensor, Tensor[])");
  m.def("path_walk_backward(Tensor queries, Tensor values, Tensor k_end, Tensor Pt, Tensor? G, Tensor? R, "
        "Tensor grad, Tensor out, Tensor lse, Tensor[] kept, int[] kept_at, int seg, int Dv) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("path_core_forward(Tensor qb, Tensor kb, Tensor wb, Tensor bb, bool save) -> Tensor[]");
  m.def("path_core_backward(Tensor ds, Tensor dq_start, Tensor dk_end, Tensor dPt, Tensor qb, Tensor kb, "
        "Tensor wb, Tensor bb, Tensor Ti, Tensor U, Tensor Y, Tensor QW) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(accrot_cpu, CPU, m) {
  m.impl("path_walk_forward", &path_walk_forward);
  m.impl("path_walk_backward", &path_walk_backward);
  m.impl("path_core_forward", &path_core_forward);
  m.impl("path_core_backward", &path_core_backward);
}
