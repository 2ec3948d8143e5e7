// SIMD kernels through Google Highway with per-target compilation and
// HWY_DYNAMIC_DISPATCH (the gemma.cpp pattern).
#include "core/linalg.h"
#include "core/parallel.h"
#include "core/rotation.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/linalg.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "core/simd-inl.h"
#include "core/vec_array-inl.h"

HWY_BEFORE_NAMESPACE();
namespace anchorkv::core {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// One output element: Dot1 (core/simd-inl.h).

// A 4 x 4 tile: the same per-element operation sequence as Dot1.
HWY_INLINE void Dot4x4(DF d, const float* HWY_RESTRICT X, int64_t ldx, const float* HWY_RESTRICT Y,
                       int64_t ldy, int64_t D, float* HWY_RESTRICT out, int64_t ldo) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto a00 = hn::Zero(d), a01 = hn::Zero(d), a02 = hn::Zero(d), a03 = hn::Zero(d);
  auto a10 = hn::Zero(d), a11 = hn::Zero(d), a12 = hn::Zero(d), a13 = hn::Zero(d);
  auto a20 = hn::Zero(d), a21 = hn::Zero(d), a22 = hn::Zero(d), a23 = hn::Zero(d);
  auto a30 = hn::Zero(d), a31 = hn::Zero(d), a32 = hn::Zero(d), a33 = hn::Zero(d);
  const float* x0 = X;
  const float* x1 = X + ldx;
  const float* x2 = X + 2 * ldx;
  const float* x3 = X + 3 * ldx;
  const float* y0 = Y;
  const float* y1 = Y + ldy;
  const float* y2 = Y + 2 * ldy;
  const float* y3 = Y + 3 * ldy;
  auto step = [&](auto vx0, auto vx1, auto vx2, auto vx3, auto vy0, auto vy1, auto vy2, auto vy3) {
    a00 = hn::MulAdd(vx0, vy0, a00); a01 = hn::MulAdd(vx0, vy1, a01);
    a02 = hn::MulAdd(vx0, vy2, a02); a03 = hn::MulAdd(vx0, vy3, a03);
    a10 = hn::MulAdd(vx1, vy0, a10); a11 = hn::MulAdd(vx1, vy1, a11);
    a12 = hn::MulAdd(vx1, vy2, a12); a13 = hn::MulAdd(vx1, vy3, a13);
    a20 = hn::MulAdd(vx2, vy0, a20); a21 = hn::MulAdd(vx2, vy1, a21);
    a22 = hn::MulAdd(vx2, vy2, a22); a23 = hn::MulAdd(vx2, vy3, a23);
    a30 = hn::MulAdd(vx3, vy0, a30); a31 = hn::MulAdd(vx3, vy1, a31);
    a32 = hn::MulAdd(vx3, vy2, a32); a33 = hn::MulAdd(vx3, vy3, a33);
  };
  int64_t i = 0;
  for (; i + N <= D; i += N) {
    step(hn::LoadU(d, x0 + i), hn::LoadU(d, x1 + i), hn::LoadU(d, x2 + i), hn::LoadU(d, x3 + i),
         hn::LoadU(d, y0 + i), hn::LoadU(d, y1 + i), hn::LoadU(d, y2 + i), hn::LoadU(d, y3 + i));
  }
  if (i < D) {
    const int64_t t = D - i;
    step(LoadTail(d, x0 + i, t), LoadTail(d, x1 + i, t), LoadTail(d, x2 + i, t), LoadTail(d, x3 + i, t),
         LoadTail(d, y0 + i, t), LoadTail(d, y1 + i, t), LoadTail(d, y2 + i, t), LoadTail(d, y3 + i, t));
  }
  auto put = [&](int64_t r, int64_t c, decltype(a00) v) {
    out[r * ldo + c] = hn::GetLane(hn::SumOfLanes(d, v));
  };
  put(0, 0, a00); put(0, 1, a01); put(0, 2, a02); put(0, 3, a03);
  put(1, 0, a10); put(1, 1, a11); put(1, 2, a12); put(1, 3, a13);
  put(2, 0, a20); put(2, 1, a21); put(2, 2, a22); put(2, 3, a23);
  put(3, 0, a30); put(3, 1, a31); put(3, 2, a32); put(3, 3, a33);
}

void DotMatrix(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy,
               int64_t D, float* out, int64_t ldo) {
  const DF d;
  // Block over Y rows so a panel of Y stays in L1/L2 while X streams.
  constexpr int64_t kPanel = 64;
  for (int64_t j0 = 0; j0 < k; j0 += kPanel) {
    const int64_t j1 = j0 + kPanel < k ? j0 + kPanel : k;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      int64_t j = j0;
      for (; j + 4 <= j1; j += 4)
        Dot4x4(d, X + i * ldx, ldx, Y + j * ldy, ldy, D, out + i * ldo + j, ldo);
      for (; j < j1; ++j)
        for (int64_t r = 0; r < 4; ++r)
          out[(i + r) * ldo + j] = Dot1(d, X + (i + r) * ldx, Y + j * ldy, D);
    }
    for (; i < n; ++i)
      for (int64_t j = j0; j < j1; ++j) out[i * ldo + j] = Dot1(d, X + i * ldx, Y + j * ldy, D);
  }
}

// R rows of C, columns [0, NV * N): outer products of A's columns with B's
// rows (one broadcast and NV multiply-adds per row and k), so no horizontal
// sums; each lane adds in k order.
template <int R, int NV>
HWY_INLINE void PanelNN(DF d, const float* HWY_RESTRICT A, int64_t lda, const float* HWY_RESTRICT B, int64_t ldb,
                        int64_t K, float* HWY_RESTRICT C, int64_t ldc) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VecArray<DF, R * NV> acc;  // acc[r * NV + v]
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc.set(r * NV + v, hn::Zero(d));
  for (int64_t k = 0; k < K; ++k) {
    VecArray<DF, NV> b;
    for (int v = 0; v < NV; ++v) b.set(v, hn::LoadU(d, B + k * ldb + v * N));
    for (int r = 0; r < R; ++r) {
      const auto a = hn::Set(d, A[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc.set(r * NV + v, hn::MulAdd(a, b.get(v), acc.get(r * NV + v)));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc.get(r * NV + v), d, C + r * ldc + v * N);
}

template <int NV>
HWY_INLINE void ColumnsNN(DF d, const float* A, int64_t n, int64_t lda, const float* B, int64_t ldb, int64_t K,
                          float* C, int64_t ldc) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) PanelNN<4, NV>(d, A + i * lda, lda, B, ldb, K, C + i * ldc, ldc);
  for (; i < n; ++i) PanelNN<1, NV>(d, A + i * lda, lda, B, ldb, K, C + i * ldc, ldc);
}

void MatmulNN(const float* A, int64_t n, int64_t lda, const float* B, int64_t ldb, int64_t K, int64_t m, float* C,
              int64_t ldc) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + 4 * N <= m; j += 4 * N) ColumnsNN<4>(d, A, n, lda, B + j, ldb, K, C + j, ldc);
  for (; j + N <= m; j += N) ColumnsNN<1>(d, A, n, lda, B + j, ldb, K, C + j, ldc);
  for (; j < m; ++j)  // columns past the last whole vector, in the same k order
    for (int64_t i = 0; i < n; ++i) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc = std::fma(A[i * lda + k], B[k * ldb + j], acc);
      C[i * ldc + j] = acc;
    }
}

// gate[i] = silu(gate[i]) * up[i]; exp's argument is capped at 88 (hn::Exp's
// valid range ends near 104; exp(88) already makes silu(x) = x / (1 + e^-x)
// round to zero for x <= -88).
void Swiglu(float* HWY_RESTRICT gate, const float* HWY_RESTRICT up, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f), cap = hn::Set(d, 88.0f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto g = hn::LoadU(d, gate + i);
    const auto e = hn::Exp(d, hn::Min(hn::Neg(g), cap));
    hn::StoreU(hn::Mul(hn::Div(g, hn::Add(one, e)), hn::LoadU(d, up + i)), d, gate + i);
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(std::min(-gate[i], 88.0f))) * up[i];
}

// y[i] = exp(x[i]) by the decode kernels' vector exp (ExpNonPositive); the
// tail through a padded vector, so every element takes the same path.
void ExpSpan(const float* HWY_RESTRICT x, int64_t n, float* HWY_RESTRICT y) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(ExpNonPositive(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float lanes[hn::MaxLanes(d)] = {};
    std::copy(x + i, x + n, lanes);
    hn::Store(ExpNonPositive(d, hn::Load(d, lanes)), d, lanes);
    std::copy(lanes, lanes + (n - i), y + i);
  }
}

HWY_INLINE float Dist1(DF d, const float* HWY_RESTRICT x, const float* HWY_RESTRICT y, int64_t D) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= D; i += N) {
    const auto diff = hn::Sub(hn::LoadU(d, x + i), hn::LoadU(d, y + i));
    acc = hn::MulAdd(diff, diff, acc);
  }
  if (i < D) {
    const auto diff = hn::Sub(LoadTail(d, x + i, D - i), LoadTail(d, y + i, D - i));
    acc = hn::MulAdd(diff, diff, acc);
  }
  return hn::GetLane(hn::SumOfLanes(d, acc));
}

void SqDistMatrix(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy,
                  int64_t D, float* out, int64_t ldo) {
  const DF d;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) out[i * ldo + j] = Dist1(d, X + i * ldx, Y + j * ldy, D);
}

int64_t AbsCosineNearMax(const float* HWY_RESTRICT dots, int64_t k, float token_norm,
                         const float* HWY_RESTRICT norms, float eps, float tol, int64_t* first) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vt = hn::Set(d, token_norm);
  const auto ve = hn::Set(d, eps);
  auto cosine = [&](int64_t j) {
    return hn::Div(hn::Abs(hn::LoadU(d, dots + j)), hn::Add(hn::Mul(vt, hn::LoadU(d, norms + j)), ve));
  };
  auto cosine_at = [&](int64_t t) { return std::fabs(dots[t]) / (token_norm * norms[t] + eps); };
  auto best = hn::Set(d, -1.0f);
  int64_t j = 0;
  for (; j + N <= k; j += N) best = hn::Max(best, cosine(j));
  float mx = hn::GetLane(hn::MaxOfLanes(d, best));
  for (int64_t t = j; t < k; ++t) mx = std::max(mx, cosine_at(t));
  const float floor = mx - tol;
  const auto vf = hn::Set(d, floor);
  int64_t count = 0;
  *first = -1;
  for (j = 0; j + N <= k; j += N) {
    const auto near = hn::Ge(cosine(j), vf);
    const size_t n = hn::CountTrue(d, near);
    if (n != 0 && *first < 0) *first = j + hn::FindFirstTrue(d, near);
    count += static_cast<int64_t>(n);
  }
  for (int64_t t = j; t < k; ++t)
    if (cosine_at(t) >= floor) {
      if (*first < 0) *first = t;
      ++count;
    }
  if (*first < 0) *first = 0;  // NaN cosines: nothing compares; the seed takes anchor 0
  return count;
}

void Axpy(float a, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, int64_t D) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, a);
  int64_t i = 0;
  for (; i + N <= D; i += N) hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  for (; i < D; ++i) y[i] += a * x[i];
}

void ScaleAdd(float a, float* HWY_RESTRICT y, float b, const float* HWY_RESTRICT x, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, a), vb = hn::Set(d, b);
  int64_t i = 0;
  if (x == nullptr) {
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(va, hn::LoadU(d, y + i)), d, y + i);
    for (; i < n; ++i) y[i] *= a;
    return;
  }
  for (; i + N <= n; i += N)
    hn::StoreU(hn::MulAdd(vb, hn::LoadU(d, x + i), hn::Mul(va, hn::LoadU(d, y + i))), d, y + i);
  for (; i < n; ++i) y[i] = a * y[i] + b * x[i];
}

float DotVec(const float* x, const float* y, int64_t D) { return Dot1(DF(), x, y, D); }

// Unnormalized fast Walsh-Hadamard transform, n a power of two with n % N == 0:
// butterflies inside each vector for h < N (HadamardWithin, one pass: a
// vector's stages touch no other vector), then across vectors for h >= N.
// Every output is the same a + b or a - b as the scalar transform, so the
// result is identical.
void Fwht(float* HWY_RESTRICT x, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const HadamardWithin<DF> within(d);
  for (int64_t i = 0; i < n; i += N) hn::StoreU(within.apply(hn::LoadU(d, x + i)), d, x + i);
  for (int64_t h = N; h < n; h <<= 1)
    for (int64_t i = 0; i < n; i += h << 1)
      for (int64_t j = i; j < i + h; j += N) {
        const auto a = hn::LoadU(d, x + j), b = hn::LoadU(d, x + j + h);
        hn::StoreU(hn::Add(a, b), d, x + j);
        hn::StoreU(hn::Sub(a, b), d, x + j + h);
      }
}

bool FwhtSupported(int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  return HWY_TARGET != HWY_SCALAR && N >= 2 && n % N == 0;
}

// out[g, :] += sum_r W[g, r] * Z[r, :]; a block of up to 8 vectors of out stays
// in registers across all r.
void AccumulateRows(const float* HWY_RESTRICT W, int64_t ldw, const float* HWY_RESTRICT Z, int64_t n, int64_t nq,
                    int64_t D, float* HWY_RESTRICT out, int64_t ldo) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t g = 0; g < nq; ++g) {
    const float* w = W + g * ldw;
    float* o = out + g * ldo;
    int64_t i = 0;
    for (; i + 4 * N <= D; i += 4 * N) {
      auto a0 = hn::LoadU(d, o + i), a1 = hn::LoadU(d, o + i + N), a2 = hn::LoadU(d, o + i + 2 * N),
           a3 = hn::LoadU(d, o + i + 3 * N);
      for (int64_t r = 0; r < n; ++r) {
        const auto wr = hn::Set(d, w[r]);
        const float* z = Z + r * D + i;
        a0 = hn::MulAdd(wr, hn::LoadU(d, z), a0);
        a1 = hn::MulAdd(wr, hn::LoadU(d, z + N), a1);
        a2 = hn::MulAdd(wr, hn::LoadU(d, z + 2 * N), a2);
        a3 = hn::MulAdd(wr, hn::LoadU(d, z + 3 * N), a3);
      }
      hn::StoreU(a0, d, o + i);
      hn::StoreU(a1, d, o + i + N);
      hn::StoreU(a2, d, o + i + 2 * N);
      hn::StoreU(a3, d, o + i + 3 * N);
    }
    for (; i + N <= D; i += N) {
      auto a = hn::LoadU(d, o + i);
      for (int64_t r = 0; r < n; ++r) a = hn::MulAdd(hn::Set(d, w[r]), hn::LoadU(d, Z + r * D + i), a);
      hn::StoreU(a, d, o + i);
    }
    for (; i < D; ++i)
      for (int64_t r = 0; r < n; ++r) o[i] += w[r] * Z[r * D + i];
  }
}

// `iters` rounds of one vector multiply-add on each of the chains `acc`; the
// chains are parameters rather than an array so that SVE's sizeless vectors
// stay in registers too.
template <class D, class... V>
HWY_INLINE hn::Vec<D> MulAddChains(D d, int64_t iters, V... acc) {
  const auto m = hn::Set(d, 0.999f), a = hn::Set(d, 1e-4f);
  for (int64_t i = 0; i < iters; ++i) ((acc = hn::MulAdd(acc, m, a)), ...);
  auto total = hn::Zero(d);
  ((total = hn::Add(total, acc)), ...);
  return total;
}

template <class D, size_t... C>
HWY_INLINE hn::Vec<D> StartMulAddChains(D d, int64_t iters, std::index_sequence<C...>) {
  return MulAddChains(d, iters, hn::Set(d, 1e-3f * static_cast<float>(C))...);
}

// Runs `iters` rounds of 24 independent vector multiply-adds (more chains
// than the FMA latency times the pipes on any CPU we target, so throughput
// is what limits it); returns the lanes multiply-added per round and sets
// `lanes` to the lanes per vector. `sink` keeps the sums.
int64_t MulAddProbe(int64_t iters, float* sink, int64_t* lanes) {
  const hn::ScalableTag<float> d;
  constexpr int kChains = 24;
  const auto total = StartMulAddChains(d, iters, std::make_index_sequence<kChains>());
  *sink = hn::GetLane(hn::SumOfLanes(d, total));
  *lanes = static_cast<int64_t>(hn::Lanes(d));
  return *lanes * kChains;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace anchorkv::core
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace anchorkv::core {

HWY_EXPORT(DotMatrix);
HWY_EXPORT(Axpy);
HWY_EXPORT(ScaleAdd);
HWY_EXPORT(AbsCosineNearMax);
HWY_EXPORT(SqDistMatrix);
HWY_EXPORT(DotVec);
HWY_EXPORT(AccumulateRows);
HWY_EXPORT(Fwht);
HWY_EXPORT(Swiglu);
HWY_EXPORT(ExpSpan);
HWY_EXPORT(MatmulNN);
HWY_EXPORT(FwhtSupported);
HWY_EXPORT(TargetName);
HWY_EXPORT(MulAddProbe);

void dot_matrix(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy,
                int64_t D, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(DotMatrix)(X, n, ldx, Y, k, ldy, D, out, ldo);
}

void dot_matrix_ref(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy,
                    int64_t D, float* out, int64_t ldo) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) out[i * ldo + j] = dot_ref(X + i * ldx, Y + j * ldy, D);
}

void sq_dist_matrix(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy,
                    int64_t D, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(SqDistMatrix)(X, n, ldx, Y, k, ldy, D, out, ldo);
}

void sq_dist_matrix_ref(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy,
                        int64_t D, float* out, int64_t ldo) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      float acc = 0;
      for (int64_t t = 0; t < D; ++t) {
        const float diff = X[i * ldx + t] - Y[j * ldy + t];
        acc += diff * diff;
      }
      out[i * ldo + j] = acc;
    }
}

void matmul_nn(const float* A, int64_t n, int64_t lda, const float* B, int64_t ldb, int64_t K, int64_t m, float* C,
               int64_t ldc) {
  HWY_DYNAMIC_DISPATCH(MatmulNN)(A, n, lda, B, ldb, K, m, C, ldc);
}

void matmul_nn_ref(const float* A, int64_t n, int64_t lda, const float* B, int64_t ldb, int64_t K, int64_t m,
                   float* C, int64_t ldc) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(A[i * lda + k]) * B[k * ldb + j];
      C[i * ldc + j] = static_cast<float>(acc);
    }
}

void swiglu(float* gate, const float* up, int64_t n) { HWY_DYNAMIC_DISPATCH(Swiglu)(gate, up, n); }

void exp_scores(const float* x, int64_t n, float* y) { HWY_DYNAMIC_DISPATCH(ExpSpan)(x, n, y); }

void swiglu_ref(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(std::min(-gate[i], 88.0f))) * up[i];
}

void geglu_tanh(float* gate, const float* up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    gate[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x))) * up[i];
  }
}

void fwht_simd(float* x, int64_t n) {
  if (HWY_DYNAMIC_DISPATCH(FwhtSupported)(n)) return HWY_DYNAMIC_DISPATCH(Fwht)(x, n);
  fwht_ref(x, n);
}

int64_t abs_cosine_near_max(const float* dots, int64_t k, float token_norm, const float* norms, float eps, float tol,
                            int64_t* first) {
  return HWY_DYNAMIC_DISPATCH(AbsCosineNearMax)(dots, k, token_norm, norms, eps, tol, first);
}

int64_t abs_cosine_near_max_ref(const float* dots, int64_t k, float token_norm, const float* norms, float eps,
                                float tol, int64_t* first) {
  float mx = -1.0f;
  for (int64_t j = 0; j < k; ++j) mx = std::max(mx, std::fabs(dots[j]) / (token_norm * norms[j] + eps));
  int64_t count = 0;
  *first = -1;
  for (int64_t j = 0; j < k; ++j)
    if (std::fabs(dots[j]) / (token_norm * norms[j] + eps) >= mx - tol) {
      if (*first < 0) *first = j;
      ++count;
    }
  if (*first < 0) *first = 0;
  return count;
}

void axpy(float a, const float* x, float* y, int64_t D) { HWY_DYNAMIC_DISPATCH(Axpy)(a, x, y, D); }

void accumulate_rows(const float* W, int64_t ldw, const float* Z, int64_t n, int64_t nq, int64_t D, float* out,
                     int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(AccumulateRows)(W, ldw, Z, n, nq, D, out, ldo);
}

void accumulate_rows_ref(const float* W, int64_t ldw, const float* Z, int64_t n, int64_t nq, int64_t D, float* out,
                         int64_t ldo) {
  for (int64_t g = 0; g < nq; ++g)
    for (int64_t r = 0; r < n; ++r) axpy_ref(W[g * ldw + r], Z + r * D, out + g * ldo, D);
}

float dot_fixed_order(const float* x, const float* y, int64_t D) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= D; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += x[i + j] * y[i + j];
  for (int j = 0; i < D; ++i, ++j) s[j] += x[i] * y[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void scale_add(float a, float* y, float b, const float* x, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ScaleAdd)(a, y, b, x, n);
}

void scale_add_ref(float a, float* y, float b, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a * y[i] + (x ? b * x[i] : 0.0f);
}

void axpy_ref(float a, const float* x, float* y, int64_t D) {
  for (int64_t i = 0; i < D; ++i) y[i] += a * x[i];
}

float dot(const float* x, const float* y, int64_t D) { return HWY_DYNAMIC_DISPATCH(DotVec)(x, y, D); }

float dot_ref(const float* x, const float* y, int64_t D) {
  float acc = 0;
  for (int64_t i = 0; i < D; ++i) acc += x[i] * y[i];
  return acc;
}

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

MulAddRate measure_multiply_add_rate(int threads) {
  const int T = resolve_threads(threads);
  constexpr int64_t kIters = 1 << 20;
  std::vector<float> sinks(static_cast<size_t>(T));
  std::vector<int64_t> per_round(static_cast<size_t>(T));
  MulAddRate best;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(T, T, [&](int64_t t) {
      const auto i = static_cast<size_t>(t);
      int64_t lanes = 0;
      per_round[i] = HWY_DYNAMIC_DISPATCH(MulAddProbe)(kIters, &sinks[i], &lanes);
      if (t == 0) best.lanes = lanes;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best.lanes_per_second = std::max(best.lanes_per_second, static_cast<double>(per_round[0]) * kIters * T / s);
  }
  return best;
}

}  // namespace anchorkv::core
#endif  // HWY_ONCE
