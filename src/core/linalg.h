// Dense float kernels used by compression. Each has a plain scalar reference
// (`*_ref`, the definition of correctness) and a SIMD version (Google Highway,
// dynamic dispatch to the best target of the running CPU). The SIMD versions
// compute every output element with the same operation order wherever it lies
// in a tile, so results do not depend on how work is split across threads.
#pragma once

#include <cstdint>

namespace anchorkv::core {

// out[i * ldo + j] = sum_d X[i * ldx + d] * Y[j * ldy + d]   (i < n, j < k)
// X: [n, D] rows with stride ldx; Y: [k, D] rows with stride ldy.
void dot_matrix(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy, int64_t D,
                float* out, int64_t ldo);
void dot_matrix_ref(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy, int64_t D,
                    float* out, int64_t ldo);

// out[i * ldo + j] = sum_d (X[i * ldx + d] - Y[j * ldy + d])^2
void sq_dist_matrix(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy, int64_t D,
                    float* out, int64_t ldo);
void sq_dist_matrix_ref(const float* X, int64_t n, int64_t ldx, const float* Y, int64_t k, int64_t ldy,
                        int64_t D, float* out, int64_t ldo);

// With c_j = |dots[j]| / (token_norm * norms[j] + eps) and m = max_j c_j:
// how many j have c_j >= m - tol, and (*first) the first of them. tol = 0
// gives the argmax, the first maximum on ties (assignment, docs/spec.md
// §4.2); a count above 1 flags a near-tie. Same IEEE operations in both
// versions, so the results are identical.
int64_t abs_cosine_near_max(const float* dots, int64_t k, float token_norm, const float* norms, float eps, float tol,
                            int64_t* first);
int64_t abs_cosine_near_max_ref(const float* dots, int64_t k, float token_norm, const float* norms, float eps,
                                float tol, int64_t* first);

// y[d] += a * x[d]
void axpy(float a, const float* x, float* y, int64_t D);
void axpy_ref(float a, const float* x, float* y, int64_t D);

// y[d] = a * y[d] + b * x[d] (x null: y[d] = a * y[d]): two running sums
// rescaled to a common shift, as online softmax merges do.
void scale_add(float a, float* y, float b, const float* x, int64_t n);
void scale_add_ref(float a, float* y, float b, const float* x, int64_t n);

// sum_d x[d] * y[d]
float dot(const float* x, const float* y, int64_t D);

// out[i] = levels[c_i] for D 2-bit codes, 4 per byte, c_i in bits 2 (i % 4) of byte i / 4.
// In-place unnormalized fast Walsh-Hadamard transform (n a power of two),
// SIMD; bit-identical to the scalar fwht_ref (core/rotation.h).
void fwht_simd(float* x, int64_t n);

void decode_codes_2bit(const uint8_t* codes, const float* levels, int64_t D, float* out);
void decode_codes_2bit_ref(const uint8_t* codes, const float* levels, int64_t D, float* out);
// out[i] = levels[c_i] for n b-bit codes (b in 1..4) packed LSB first
// (core/bitpack.h): code i in bits [i b, (i + 1) b) of the byte stream.
void decode_codes(const uint8_t* codes, int bits, const float* levels, int64_t n, float* out);
void decode_codes_ref(const uint8_t* codes, int bits, const float* levels, int64_t n, float* out);

// Rows of affine codes rebuilt: out[r * D + d] = fma(c, scale, zero) with c
// the b-bit code (b in {1, 2, 4, 8}) of channel d of row r, rows of D * b / 8
// bytes packed LSB first, and (scale, zero) = pairs[2 (r * ceil(D / cg) + d / cg)]:
// one pair per row and group of cg channels. D * b and cg * b (when cg < D)
// are multiples of 8.
void decode_affine(const uint8_t* codes, int bits, const float* pairs, int64_t rows, int64_t D, int64_t cg,
                   float* out);
void decode_affine_ref(const uint8_t* codes, int bits, const float* pairs, int64_t rows, int64_t D, int64_t cg,
                       float* out);

// out[g * ldo + :D] += sum_{r < n} W[g * ldw + r] * Z[r * D + :D] for g < nq
// (the value side of attention over n rows at once).
void accumulate_rows(const float* W, int64_t ldw, const float* Z, int64_t n, int64_t nq, int64_t D,
                     float* out, int64_t ldo);
void accumulate_rows_ref(const float* W, int64_t ldw, const float* Z, int64_t n, int64_t nq, int64_t D,
                         float* out, int64_t ldo);
float dot_ref(const float* x, const float* y, int64_t D);
// sum_d x[d] * y[d] in one order on every CPU and build: eight partial sums
// (d mod 8) added pairwise. Plain C++ the compiler may vectorize without
// changing a bit; for values two paths must agree on exactly (compress:
// the projection coefficient).
float dot_fixed_order(const float* x, const float* y, int64_t D);

// C[i * ldc + j] = sum_k A[i * lda + k] * B[k * ldb + j]   (i < n, j < m, k < K):
// B row-major, so the SIMD version broadcasts A and streams B's rows (outer
// products, no horizontal sums; attention's Q K^T with K transposed, P V).
// Every output adds its products in k order; the twin sums in double.
void matmul_nn(const float* A, int64_t n, int64_t lda, const float* B, int64_t ldb, int64_t K, int64_t m, float* C,
               int64_t ldc);
void matmul_nn_ref(const float* A, int64_t n, int64_t lda, const float* B, int64_t ldb, int64_t K, int64_t m,
                   float* C, int64_t ldc);

// gate[i] = silu(gate[i]) * up[i] (SwiGLU; silu(x) = x / (1 + e^-x), the
// exponent capped at 88). SIMD exp within a few ulp of the twin's std::exp.
void swiglu(float* gate, const float* up, int64_t n);
void swiglu_ref(float* gate, const float* up, int64_t n);
// gate[i] = gelu(gate[i]) * up[i] with GELU's tanh form (GeGLU, Gemma):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Scalar (no SIMD twin).
void geglu_tanh(float* gate, const float* up, int64_t n);

// y[i] = exp(x[i]) for x[i] <= 88 by the attention kernels' vector exp
// (softmax shifts: core/simd-inl.h ExpNonPositive), within 2.1 ulp of
// std::exp, exactly 1 at 0, and 0 below -87 (-inf included).
void exp_scores(const float* x, int64_t n, float* y);

// Name of the SIMD target the dispatcher picks on this CPU (e.g. "AVX3").
const char* simd_target_name();

// Measured peak of fp32 vector multiply-adds on this machine: lanes per second
// summed over `threads` threads (0 = all cores), the best of five short
// passes (~20 ms each), and the lanes per vector of the target that ran. The
// compute roof of a kernel's roofline, as a benchmark reports it beside
// the read bandwidth.
struct MulAddRate {
  double lanes_per_second = 0;
  int64_t lanes = 0;
};
MulAddRate measure_multiply_add_rate(int threads);

}  // namespace anchorkv::core
