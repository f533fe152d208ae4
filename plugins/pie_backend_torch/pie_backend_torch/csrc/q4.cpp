// 4-bit (q4), 8-bit (q8) and 5-bit (q5, below) weights times int8 activations on the CPU, and the steps around the w8a8 path's integer
// product, as torch operators (namespace pie_cpu). Built from this file on first use by
// pie_backend_torch/native.py with -march=native; the vector paths below are chosen by what the
// compiler was told the CPU has (AVX512-VNNI, AVX-VNNI, plain AVX2).
//
// Weight format (per linear, N outputs, K inputs, K % 32 == 0), made by native.pack_q4: one
// uint8 tensor [ceil(N/16), K/32 * 320]. Output rows go in groups of 16 (the last one padded with
// zero rows); a group is one sequential run of K/32 blocks of 32 inputs, 320 bytes a block:
//   256 bytes   4 chunks of 64; byte 4r+t of chunk c (r: row of the group, t in 0..3) holds the
//               row's input 4c+t in its low nibble and its input 16+4c+t in its high nibble
//   16 halfs    scale of each row
//   16 halfs    low of each row: w = q * scale + low, q in 0..15
// A 32-bit lane of a vector is one output row: four activation bytes, broadcast, meet four
// weights of 16 rows (8 on AVX2) in one unsigned-by-signed dot product (vpdpbusd), so the sums
// need no horizontal reduction and the weights stream from memory once, front to back.
// Activations are quantised per block of 32 inputs (symmetric, int8 in [-127, 127]), so an
// outlier channel costs precision only to its own block.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = 16;
constexpr int kBlockBytes = 320;
constexpr int64_t kPrefetchBytes = 8 * kBlockBytes;  // the weights stream once per step: ask 8 blocks ahead
#ifndef PIE_HINT
#define PIE_HINT _MM_HINT_T0
#endif

// One row of x: int8 values, per-block scale, and per-block scale * sum of the int8 values.
void quantise_row(const float* x, int64_t K, int8_t* q, float* step, float* sum) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    __m256 peak = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < kBlock; i += 8) peak = _mm256_max_ps(peak, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(peak), _mm256_extractf128_ps(peak, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float amax = _mm_cvtss_f32(m);
    const float d = amax / 127.0f;
    const __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    __m256i total = _mm256_setzero_si256();
    for (int i = 0; i < kBlock; i += 8) {
      __m256i v = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      total = _mm256_add_epi32(total, v);
      __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      __m128i p8 = _mm_packs_epi16(p16, p16);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + b * kBlock + i), p8);
    }
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_hadd_epi32(t, t);
    t = _mm_hadd_epi32(t, t);
    step[b] = d;
    sum[b] = d * static_cast<float>(_mm_cvtsi128_si32(t));
  }
}

inline int32_t four_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Two-step activations ("fine"): row r of x becomes rows 2r (its int8 blocks) and 2r + 1 (the
// int8 blocks of what they missed, x - q * step), about 15 bits in all; the two products are
// summed per row, (first + second) + bias, in that order whatever the batch.
// quantise(x, row) writes quantised row `row`; q and step point at xq and its per-block steps.
template <typename Quantise>
void quantise_rows(const float* xp, int64_t M, int64_t K, int64_t block, bool fine, const int8_t* q, const float* step,
                   int64_t steps_per_row, Quantise quantise) {
  at::parallel_for(0, M, M >= 16 ? 1 : M, [&](int64_t r0, int64_t r1) {
    std::vector<float> rest(fine ? K : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = xp + r * K;
      const int64_t row = fine ? 2 * r : r;
      quantise(x, row);
      if (!fine) continue;
      const int8_t* qr = q + row * K;
      const float* sr = step + row * steps_per_row;
      for (int64_t k = 0; k < K; ++k) rest[k] = x[k] - static_cast<float>(qr[k]) * sr[k / block];
      quantise(rest.data(), row + 1);
    }
  });
}

// y [M, N] = (y2[2r] + y2[2r + 1]) + bias for the two-step rows of y2 [2M, N].
void sum_steps(const float* y2, int64_t M, int64_t N, const float* bias, float* y) {
  at::parallel_for(0, M, M >= 16 ? 1 : M, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < N; ++j) y[r * N + j] = (y2[2 * r * N + j] + y2[(2 * r + 1) * N + j]) + (bias ? bias[j] : 0.0f);
  });
}

// A block adds to row j's sum (for one x row): dot(q_j, x_int8) * scale_j * xstep + low_j * xstep * sum(x_int8).
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// Group `g` (K/32 blocks) against R rows of x: out[r * ldo + j] = row j's dot with x row r + bias[j],
// for the `width` <= 16 rows the group holds.
template <int R>
void group_tile(const uint8_t* g, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const float* xsum,
                float* out, int64_t ldo, int64_t width, const float* bias) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kBlockBytes;
    for (int i = 0; i < kBlockBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + i), PIE_HINT);
    __m512i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(p + 64 * c);
      lo[c] = _mm512_and_si512(v, mask);
      hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
    const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 256)));
    const __m512 low = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 288)));
    for (int r = 0; r < R; ++r) {
      const int8_t* xb = xq + r * K + b * kBlock;
      __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], _mm512_set1_epi32(four_bytes(xb)));
      __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[0], _mm512_set1_epi32(four_bytes(xb + 16)));
      for (int c = 1; c < 4; ++c) {
        d0 = _mm512_dpbusd_epi32(d0, lo[c], _mm512_set1_epi32(four_bytes(xb + 4 * c)));
        d1 = _mm512_dpbusd_epi32(d1, hi[c], _mm512_set1_epi32(four_bytes(xb + 16 + 4 * c)));
      }
      const __m512 s = _mm512_mul_ps(scale, _mm512_set1_ps(xstep[r * nb + b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), s, acc[r]);
      acc[r] = _mm512_fmadd_ps(low, _mm512_set1_ps(xsum[r * nb + b]), acc[r]);
    }
  }
  const __mmask16 k = static_cast<__mmask16>((1u << width) - 1);
  const __m512 bv = bias ? _mm512_maskz_loadu_ps(k, bias) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * ldo, k, _mm512_add_ps(acc[r], bv));
}
#else
// The x block's 32 bytes against one half (8 rows) of a block's weights, as 8 int32 sums.
inline __m256i dot_half(const __m256i* lo, const __m256i* hi, const int8_t* xb) {
#if defined(__AVXVNNI__)
  __m256i d0 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo[0], _mm256_set1_epi32(four_bytes(xb)));
  __m256i d1 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), hi[0], _mm256_set1_epi32(four_bytes(xb + 16)));
  for (int c = 1; c < 4; ++c) {
    d0 = _mm256_dpbusd_avx_epi32(d0, lo[c], _mm256_set1_epi32(four_bytes(xb + 4 * c)));
    d1 = _mm256_dpbusd_avx_epi32(d1, hi[c], _mm256_set1_epi32(four_bytes(xb + 16 + 4 * c)));
  }
  return _mm256_add_epi32(d0, d1);
#else
  // pairs of products summed to int16 (|q * x| <= 15 * 127, 16 of them stay below 2^15), then
  // the pairs to int32
  __m256i s = _mm256_maddubs_epi16(lo[0], _mm256_set1_epi32(four_bytes(xb)));
  s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[0], _mm256_set1_epi32(four_bytes(xb + 16))));
  for (int c = 1; c < 4; ++c) {
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(lo[c], _mm256_set1_epi32(four_bytes(xb + 4 * c))));
    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi[c], _mm256_set1_epi32(four_bytes(xb + 16 + 4 * c))));
  }
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
}

// One half (rows 8h..8h+7) of group `g` against R rows of x; as the AVX512 group_tile otherwise.
template <int R>
void half_tile(const uint8_t* g, int h, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const float* xsum,
               float* out, int64_t ldo, int64_t width, const float* bias) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kBlockBytes;
    if (h == 0)
      for (int i = 0; i < kBlockBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + i), PIE_HINT);
    __m256i lo[4], hi[4];
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * c + 32 * h));
      lo[c] = _mm256_and_si256(v, mask);
      hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 256 + 16 * h)));
    const __m256 low = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 288 + 16 * h)));
    for (int r = 0; r < R; ++r) {
      const __m256i d = dot_half(lo, hi, xq + r * K + b * kBlock);
      const __m256 s = _mm256_mul_ps(scale, _mm256_set1_ps(xstep[r * nb + b]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc[r]);
      acc[r] = _mm256_fmadd_ps(low, _mm256_set1_ps(xsum[r * nb + b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float row[8];
    _mm256_store_ps(row, acc[r]);
    for (int64_t j = 0; j < width; ++j) out[r * ldo + j] = row[j] + (bias ? bias[j] : 0.0f);
  }
}

template <int R>
void group_tile(const uint8_t* g, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const float* xsum,
                float* out, int64_t ldo, int64_t width, const float* bias) {
  half_tile<R>(g, 0, nb, xq, K, xstep, xsum, out, ldo, std::min<int64_t>(width, 8), bias);
  if (width > 8) half_tile<R>(g, 1, nb, xq, K, xstep, xsum, out + 8, ldo, width - 8, bias ? bias + 8 : nullptr);
}
#endif

// Groups [g0, g1) against all M rows of x, 4 x rows at a time (the group's weights, unpacked
// once per block, serve all 4).
void group_range(const uint8_t* w, int64_t nb, const int8_t* xq, const float* xstep, const float* xsum,
                 int64_t M, int64_t K, int64_t N, float* y, const float* bias, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = w + g * nb * kBlockBytes;
    const int64_t n = g * kGroup, width = std::min(kGroup, N - n);
    const float* bg = bias ? bias + n : nullptr;
    for (int64_t r = 0; r < M; r += 4) {
      const int8_t* x = xq + r * K;
      const float *st = xstep + r * nb, *su = xsum + r * nb;
      float* o = y + r * N + n;
      switch (std::min<int64_t>(4, M - r)) {
        case 1: group_tile<1>(gp, nb, x, K, st, su, o, N, width, bg); break;
        case 2: group_tile<2>(gp, nb, x, K, st, su, o, N, width, bg); break;
        case 3: group_tile<3>(gp, nb, x, K, st, su, o, N, width, bg); break;
        default: group_tile<4>(gp, nb, x, K, st, su, o, N, width, bg); break;
      }
    }
  }
}

at::Tensor q4_linear(const at::Tensor& x_in, const at::Tensor& w, int64_t N, const c10::optional<at::Tensor>& bias, bool fine) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), "q4_linear: x must be a 2-D CPU tensor");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), nb = K / kBlock, groups = (N + kGroup - 1) / kGroup;
  TORCH_CHECK(K % kBlock == 0, "q4_linear: in_features must be a multiple of 32, got ", K);
  TORCH_CHECK(N > 0, "q4_linear: n must be positive, got ", N);
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.size(0) == groups && w.size(1) == nb * kBlockBytes,
              "q4_linear: weights must be contiguous uint8 [", groups, ", ", nb * kBlockBytes, "] for in_features ", K,
              " and out_features ", N, ", got ", w.sizes());
  at::Tensor b32;
  if (bias.has_value()) {
    b32 = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b32.numel() == N, "q4_linear: bias must have N elements");
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const int64_t rows = fine ? 2 * M : M;
  at::Tensor xq = at::empty({rows, K}, x.options().dtype(at::kChar));
  at::Tensor xstep = at::empty({rows, nb}, x.options());
  at::Tensor xsum = at::empty({rows, nb}, x.options());
  const float* xp = x.data_ptr<float>();
  int8_t* xqp = xq.data_ptr<int8_t>();
  float* sp = xstep.data_ptr<float>();
  float* up = xsum.data_ptr<float>();
  quantise_rows(xp, M, K, kBlock, fine, xqp, sp, nb,
                [&](const float* row, int64_t r) { quantise_row(row, K, xqp + r * K, sp + r * nb, up + r * nb); });
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* bp = bias.has_value() ? b32.data_ptr<float>() : nullptr;
  at::Tensor y2 = fine ? at::empty({rows, N}, x.options()) : y;
  float* yp = y2.data_ptr<float>();
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
    group_range(wp, nb, xqp, sp, up, rows, K, N, yp, fine ? nullptr : bp, g0, g1);
  });
  if (fine) sum_steps(yp, M, N, bp, y.data_ptr<float>());
  return y;
}


// ---- q8: int8 weights (blocks of 32 inputs, a float16 scale per 16) times int8 activations ----
// Weight format (made by native.pack_q8): uint8 [ceil(N/16), K/32 * 576]; a group of 16 rows is a
// run of K/32 blocks of 576 bytes:
//   512 bytes   8 chunks of 64; byte 4r+t of chunk c holds row r's input 4c+t as w + 128 (w in -127..127)
//   32 halfs    scale of inputs 0..15 of each row (16), then of inputs 16..31 (16): w_real = w * scale
// Activations are quantised per 16 inputs (the weights' scale blocks). Every dot product of 16 inputs is an exact
// int32, and a row's float sum runs over its blocks in one fixed order whatever the other rows,
// the tile size or the vector path (AVX512-VNNI, AVX2 give bitwise the same results).
constexpr int kQ8BlockBytes = 576;

// One row of x for q8: int8 values, a scale and the sum of the int8 values per 16 inputs (the
// weights' scale blocks): finer steps than q4's 32 where an outlier shares a block.
void quantise_row8(const float* x, int64_t K, int8_t* q, float* step, int32_t* isum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t h = 0; h < K / 16; ++h) {
    const float* xb = x + h * 16;
    const __m256 a = _mm256_loadu_ps(xb), b = _mm256_loadu_ps(xb + 8);
    __m256 peak = _mm256_max_ps(_mm256_andnot_ps(sign, a), _mm256_andnot_ps(sign, b));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(peak), _mm256_extractf128_ps(peak, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    const __m256i va = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(a, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i vb = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(b, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i p16 = _mm256_packs_epi32(va, vb);  // lanes: a0-3 b0-3 a4-7 b4-7
    const __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
    // p8 bytes: a0-3 b0-3 a4-7 b4-7 -> a0-7 b0-7
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + h * 16), _mm_shuffle_epi32(p8, _MM_SHUFFLE(3, 1, 2, 0)));
    __m256i t = _mm256_add_epi32(va, vb);
    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    u = _mm_hadd_epi32(u, u);
    u = _mm_hadd_epi32(u, u);
    step[h] = d;
    isum[h] = _mm_cvtsi128_si32(u);
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// One x row's block against a block of 16 rows of unsigned weights u = w + offset (8 chunks: inputs
// 0..15, then 16..31): acc += (sum u x - offset sum x) * scale * xstep per 16 inputs. q8 and q5
// share it, so their float steps are the same.
inline __m512 int8_block(__m512 acc, const __m512i* w, const int8_t* xb, const int32_t* is, const float* xs, int offset,
                         __m512 s0, __m512 s1) {
  __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(four_bytes(xb)));
  __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[4], _mm512_set1_epi32(four_bytes(xb + 16)));
  for (int c = 1; c < 4; ++c) {
    d0 = _mm512_dpbusd_epi32(d0, w[c], _mm512_set1_epi32(four_bytes(xb + 4 * c)));
    d1 = _mm512_dpbusd_epi32(d1, w[4 + c], _mm512_set1_epi32(four_bytes(xb + 16 + 4 * c)));
  }
  d0 = _mm512_sub_epi32(d0, _mm512_set1_epi32(offset * is[0]));
  d1 = _mm512_sub_epi32(d1, _mm512_set1_epi32(offset * is[1]));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_mul_ps(s0, _mm512_set1_ps(xs[0])), acc);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_mul_ps(s1, _mm512_set1_ps(xs[1])), acc);
}

template <int R>
void q8_tile(const uint8_t* g, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const int32_t* isum,
             float* out, int64_t ldo, int64_t width, const float* bias) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ8BlockBytes;
    for (int i = 0; i < kQ8BlockBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 8 * kQ8BlockBytes + i), PIE_HINT);
    __m512i w[8];
    for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(p + 64 * c);
    const __m512 s0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 512)));
    const __m512 s1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 544)));
    for (int r = 0; r < R; ++r)
      acc[r] = int8_block(acc[r], w, xq + r * K + b * kBlock, isum + r * 2 * nb + 2 * b, xstep + r * 2 * nb + 2 * b, 128, s0, s1);
  }
  const __mmask16 k = static_cast<__mmask16>((1u << width) - 1);
  const __m512 bv = bias ? _mm512_maskz_loadu_ps(k, bias) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * ldo, k, _mm512_add_ps(acc[r], bv));
}
#else
// 16 inputs of 8 rows (half h of the group) against x's bytes, as exact int32 sums: signed
// weights times signed activations through the sign trick (|w|, x * sign(w)), pairs to int16
// (at most 2 * 127 * 127) and at once to int32.
inline __m256i q8_dot16(const uint8_t* p, int h, int c0, const int8_t* xb) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i total = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * (c0 + c) + 32 * h)), flip);
    const __m256i x = _mm256_set1_epi32(four_bytes(xb + 4 * c));
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    total = _mm256_add_epi32(total, _mm256_madd_epi16(pairs, ones));
  }
  return total;
}

template <int R>
void q8_half(const uint8_t* g, int h, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, float* out, int64_t ldo,
             int64_t width, const float* bias) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ8BlockBytes;
    if (h == 0)
      for (int i = 0; i < kQ8BlockBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 8 * kQ8BlockBytes + i), PIE_HINT);
    const __m256 s0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 512 + 16 * h)));
    const __m256 s1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 544 + 16 * h)));
    for (int r = 0; r < R; ++r) {
      const int8_t* xb = xq + r * K + b * kBlock;
      const __m256i d0 = q8_dot16(p, h, 0, xb), d1 = q8_dot16(p, h, 4, xb + 16);
      const float* xs = xstep + r * 2 * nb + 2 * b;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(s0, _mm256_set1_ps(xs[0])), acc[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(s1, _mm256_set1_ps(xs[1])), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float row[8];
    _mm256_store_ps(row, acc[r]);
    for (int64_t j = 0; j < width; ++j) out[r * ldo + j] = row[j] + (bias ? bias[j] : 0.0f);
  }
}

template <int R>
void q8_tile(const uint8_t* g, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const int32_t* isum,
             float* out, int64_t ldo, int64_t width, const float* bias) {
  q8_half<R>(g, 0, nb, xq, K, xstep, out, ldo, std::min<int64_t>(width, 8), bias);
  if (width > 8) q8_half<R>(g, 1, nb, xq, K, xstep, out + 8, ldo, width - 8, bias ? bias + 8 : nullptr);
}
#endif

// The tile of one int8-activation format for R rows of x (R = 1..4): group g's nb blocks against
// x's int8 rows xq (their steps and int sums per 16 inputs), into out[r * ldo + j] for j < width.
using Tile = void (*)(const uint8_t* g, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const int32_t* isum,
                      float* out, int64_t ldo, int64_t width, const float* bias);

// y = x @ w.T + bias for the formats whose activations are int8 per 16 inputs (q8, q5): x's rows
// quantised once, then every group of 16 outputs against all rows, 4 rows at a time.
at::Tensor int8_linear(const char* name, int64_t block_bytes, const Tile (&tiles)[4], const at::Tensor& x_in,
                       const at::Tensor& w, int64_t N, const c10::optional<at::Tensor>& bias, bool fine) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), name, ": x must be a 2-D CPU tensor");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), nb = K / kBlock, groups = (N + kGroup - 1) / kGroup;
  TORCH_CHECK(K % kBlock == 0, name, ": in_features must be a multiple of 32, got ", K);
  TORCH_CHECK(N > 0, name, ": n must be positive, got ", N);
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.size(0) == groups && w.size(1) == nb * block_bytes,
              name, ": weights must be contiguous uint8 [", groups, ", ", nb * block_bytes, "] for in_features ", K,
              " and out_features ", N, ", got ", w.sizes());
  at::Tensor b32;
  if (bias.has_value()) {
    b32 = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b32.numel() == N, name, ": bias must have N elements");
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const int64_t rows = fine ? 2 * M : M;
  at::Tensor xq = at::empty({rows, K}, x.options().dtype(at::kChar));
  at::Tensor xstep = at::empty({rows, 2 * nb}, x.options());
  at::Tensor xsum = at::empty({rows, 2 * nb}, x.options().dtype(at::kInt));
  const float* xp = x.data_ptr<float>();
  int8_t* xqp = xq.data_ptr<int8_t>();
  float* sp = xstep.data_ptr<float>();
  int32_t* up = xsum.data_ptr<int32_t>();
  quantise_rows(xp, M, K, 16, fine, xqp, sp, 2 * nb,
                [&](const float* row, int64_t r) { quantise_row8(row, K, xqp + r * K, sp + r * 2 * nb, up + r * 2 * nb); });
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* bp = bias.has_value() ? b32.data_ptr<float>() : nullptr;
  at::Tensor y2 = fine ? at::empty({rows, N}, x.options()) : y;
  float* yp = y2.data_ptr<float>();
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* gp = wp + g * nb * block_bytes;
      const int64_t n = g * kGroup, width = std::min(kGroup, N - n);
      const float* bg = bp && !fine ? bp + n : nullptr;
      for (int64_t r = 0; r < rows; r += 4)
        tiles[std::min<int64_t>(4, rows - r) - 1](gp, nb, xqp + r * K, K, sp + r * 2 * nb, up + r * 2 * nb, yp + r * N + n, N,
                                                  width, bg);
    }
  });
  if (fine) sum_steps(yp, M, N, bp, y.data_ptr<float>());
  return y;
}

constexpr Tile kQ8Tiles[4] = {&q8_tile<1>, &q8_tile<2>, &q8_tile<3>, &q8_tile<4>};

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& w, int64_t N, const c10::optional<at::Tensor>& bias, bool fine) {
  return int8_linear("q8_linear", kQ8BlockBytes, kQ8Tiles, x, w, N, bias, fine);
}

// ---- q5: 5-bit weights (GGUF Q5_0 kept bit for bit) times int8 activations per 16 inputs ----
// Weight format (made by q5.pack): uint8 [ceil(N/16), K/32 * 352]; a group of 16 rows is a run of
// K/32 blocks of 352 bytes; u = w + 16 in 0..31 (w in -16..15):
//   256 bytes   4 chunks of 64; byte 4r+t of chunk c holds the low 4 bits of u for row r's input
//               4c+t (low nibble) and for its input 16+4c+t (high nibble), as q4
//   64 bytes    8 masks of 64 bits; bit 4r+t of mask c is bit 4 of u for row r's input 4c+t
//   16 halfs    scale of each row for the block: w_real = w * scale
// The integer sums are q8's exactly (sum (w + 16) x - 16 sum x), and so is the float arithmetic
// after them: on the same weights q5 and q8 give bitwise the same results, in 0.61 of the bytes.
constexpr int kQ5BlockBytes = 352;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
template <int R>
void q5_tile(const uint8_t* g, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const int32_t* isum,
             float* out, int64_t ldo, int64_t width, const float* bias) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ5BlockBytes;
    for (int i = 0; i < kQ5BlockBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 8 * kQ5BlockBytes + i), PIE_HINT);
    __m512i w[8];
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(p + 64 * c);
      w[c] = _mm512_and_si512(v, low4);
      w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
    for (int c = 0; c < 8; ++c) {
      uint64_t bits;
      std::memcpy(&bits, p + 256 + 8 * c, 8);
      w[c] = _mm512_mask_add_epi8(w[c], _cvtu64_mask64(bits), w[c], bit4);
    }
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 320)));
    for (int r = 0; r < R; ++r)
      acc[r] = int8_block(acc[r], w, xq + r * K + b * kBlock, isum + r * 2 * nb + 2 * b, xstep + r * 2 * nb + 2 * b, 16, s, s);
  }
  const __mmask16 k = static_cast<__mmask16>((1u << width) - 1);
  const __m512 bv = bias ? _mm512_maskz_loadu_ps(k, bias) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * ldo, k, _mm512_add_ps(acc[r], bv));
}
#else
// 32 bits of a mask as 32 bytes: 0x10 where the bit is set (byte i: bit i).
inline __m256i bits_to_16s(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i select = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread), select);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, select), _mm256_set1_epi8(0x10));
}

// 16 inputs (4 chunks of u, 0..31) of 8 rows against x's bytes, as int32 sums of u * x.
inline __m256i q5_dot16(const __m256i* w, const int8_t* xb) {
#if defined(__AVXVNNI__)
  __m256i d = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) d = _mm256_dpbusd_avx_epi32(d, w[c], _mm256_set1_epi32(four_bytes(xb + 4 * c)));
  return d;
#else
  // pairs of products to int16, 4 chunks summed there: |sum| <= 8 * 31 * 127 < 2^15
  __m256i s = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(four_bytes(xb)));
  for (int c = 1; c < 4; ++c) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[c], _mm256_set1_epi32(four_bytes(xb + 4 * c))));
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
}

template <int R>
void q5_half(const uint8_t* g, int h, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const int32_t* isum,
             float* out, int64_t ldo, int64_t width, const float* bias) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = g + b * kQ5BlockBytes;
    if (h == 0)
      for (int i = 0; i < kQ5BlockBytes; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 8 * kQ5BlockBytes + i), PIE_HINT);
    __m256i w[8];
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * c + 32 * h));
      w[c] = _mm256_and_si256(v, low4);
      w[4 + c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
    for (int c = 0; c < 8; ++c) {
      uint32_t bits;
      std::memcpy(&bits, p + 256 + 8 * c + 4 * h, 4);
      w[c] = _mm256_or_si256(w[c], bits_to_16s(bits));
    }
    const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 320 + 16 * h)));
    for (int r = 0; r < R; ++r) {
      const int8_t* xb = xq + r * K + b * kBlock;
      const int32_t* is = isum + r * 2 * nb + 2 * b;
      const float* xs = xstep + r * 2 * nb + 2 * b;
      const __m256i d0 = _mm256_sub_epi32(q5_dot16(w, xb), _mm256_set1_epi32(16 * is[0]));
      const __m256i d1 = _mm256_sub_epi32(q5_dot16(w + 4, xb + 16), _mm256_set1_epi32(16 * is[1]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(s, _mm256_set1_ps(xs[0])), acc[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(s, _mm256_set1_ps(xs[1])), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float row[8];
    _mm256_store_ps(row, acc[r]);
    for (int64_t j = 0; j < width; ++j) out[r * ldo + j] = row[j] + (bias ? bias[j] : 0.0f);
  }
}

template <int R>
void q5_tile(const uint8_t* g, int64_t nb, const int8_t* xq, int64_t K, const float* xstep, const int32_t* isum,
             float* out, int64_t ldo, int64_t width, const float* bias) {
  q5_half<R>(g, 0, nb, xq, K, xstep, isum, out, ldo, std::min<int64_t>(width, 8), bias);
  if (width > 8) q5_half<R>(g, 1, nb, xq, K, xstep, isum, out + 8, ldo, width - 8, bias ? bias + 8 : nullptr);
}
#endif

constexpr Tile kQ5Tiles[4] = {&q5_tile<1>, &q5_tile<2>, &q5_tile<3>, &q5_tile<4>};

at::Tensor q5_linear(const at::Tensor& x, const at::Tensor& w, int64_t N, const c10::optional<at::Tensor>& bias, bool fine) {
  return int8_linear("q5_linear", kQ5BlockBytes, kQ5Tiles, x, w, N, bias, fine);
}


// w8a8, before the integer product: the `count` input channels of largest magnitude over the
// batch (outliers, returned sorted), their float32 values `wide` [M, count], and the rest of each
// row quantised symmetrically to int8 against the row's own peak (`step` [M, 1] = peak / 127),
// the outlier channels set to 0. One pass per row instead of a dozen tensor ops.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> w8a8_quantise(const at::Tensor& x_in, int64_t count) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), "w8a8_quantise: x must be a 2-D CPU tensor");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  count = std::min(count, K);
  TORCH_CHECK(count >= 0, "w8a8_quantise: count must be >= 0");
  const float* xp = x.data_ptr<float>();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  std::vector<float> peak(K, 0.0f);
  const int64_t K8 = K / 8 * 8;
  for (int64_t r = 0; r < M; ++r) {
    const float* row = xp + r * K;
    for (int64_t k = 0; k < K8; k += 8)
      _mm256_storeu_ps(&peak[k], _mm256_max_ps(_mm256_loadu_ps(&peak[k]), _mm256_andnot_ps(sign, _mm256_loadu_ps(row + k))));
    for (int64_t k = K8; k < K; ++k) peak[k] = std::max(peak[k], std::fabs(row[k]));
  }
  std::vector<int64_t> order(K);
  for (int64_t k = 0; k < K; ++k) order[k] = k;
  std::nth_element(order.begin(), order.begin() + count, order.end(), [&](int64_t a, int64_t b) {
    return peak[a] > peak[b] || (peak[a] == peak[b] && a < b);
  });
  order.resize(count);
  std::sort(order.begin(), order.end());
  at::Tensor outliers = at::empty({count}, x.options().dtype(at::kLong));
  std::copy(order.begin(), order.end(), outliers.data_ptr<int64_t>());
  at::Tensor wide = at::empty({M, count}, x.options());
  at::Tensor xq = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor step = at::empty({M, 1}, x.options());
  float* wp = wide.data_ptr<float>();
  int8_t* qp = xq.data_ptr<int8_t>();
  float* sp = step.data_ptr<float>();
  at::parallel_for(0, M, 4, [&](int64_t r0, int64_t r1) {
    std::vector<float> kept(K);  // the row with its outlier channels set to 0
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = xp + r * K;
      std::copy(row, row + K, kept.begin());
      for (int64_t j = 0; j < count; ++j) {
        wp[r * count + j] = row[order[j]];
        kept[order[j]] = 0.0f;
      }
      __m256 top = _mm256_setzero_ps();
      for (int64_t k = 0; k < K8; k += 8) top = _mm256_max_ps(top, _mm256_andnot_ps(sign, _mm256_loadu_ps(&kept[k])));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, top);
      float amax = *std::max_element(lanes, lanes + 8);
      for (int64_t k = K8; k < K; ++k) amax = std::max(amax, std::fabs(kept[k]));
      const float d = std::max(amax, 1e-12f) / 127.0f;
      const float inv = 1.0f / d;
      const __m256 vinv = _mm256_set1_ps(inv);
      int8_t* q = qp + r * K;
      for (int64_t k = 0; k < K8; k += 8) {  // rounds half to even, as nearbyint does
        const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(&kept[k]), vinv));
        const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), _mm_packs_epi16(p16, p16));
      }
      for (int64_t k = K8; k < K; ++k) q[k] = static_cast<int8_t>(std::nearbyint(kept[k] * inv));
      sp[r] = d;
    }
  });
  return {xq, step, outliers, wide};
}

// w8a8, after the integer product: y = acc * step * scale + wide @ kept + bias, float32 [M, N].
at::Tensor w8a8_finish(const at::Tensor& acc, const at::Tensor& step, const at::Tensor& scale, const at::Tensor& wide,
                       const at::Tensor& kept, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(acc.scalar_type() == at::kInt && acc.dim() == 2, "w8a8_finish: acc must be int32 [M, N]");
  const int64_t M = acc.size(0), N = acc.size(1), C = wide.size(1);
  const at::Tensor a = acc.contiguous();
  const at::Tensor st = step.to(at::kFloat).contiguous(), sc = scale.to(at::kFloat).contiguous();
  const at::Tensor wd = wide.to(at::kFloat).contiguous(), kp = kept.to(at::kFloat).contiguous();
  TORCH_CHECK(st.numel() == M && sc.numel() == N && wd.size(0) == M && kp.size(0) == C && kp.size(1) == N,
              "w8a8_finish: shapes do not match");
  at::Tensor b;
  if (bias.has_value()) {
    b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.numel() == N, "w8a8_finish: bias must have N elements");
  }
  at::Tensor y = at::empty({M, N}, a.options().dtype(at::kFloat));
  const int32_t* __restrict ap = a.data_ptr<int32_t>();
  const float* __restrict stp = st.data_ptr<float>();
  const float* __restrict scp = sc.data_ptr<float>();
  const float* __restrict wdp = wd.data_ptr<float>();
  const float* __restrict kpp = kp.data_ptr<float>();
  const float* __restrict bp = bias.has_value() ? b.data_ptr<float>() : nullptr;
  float* __restrict yp = y.data_ptr<float>();
  constexpr int64_t kCols = 512;  // a slice of every outlier row stays in L1 across the rows
  at::parallel_for(0, (N + kCols - 1) / kCols, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t n0 = c0 * kCols; n0 < std::min(N, c1 * kCols); n0 += kCols) {
      const int64_t width = std::min(kCols, N - n0);
      for (int64_t r = 0; r < M; ++r) {
        float* __restrict out = yp + r * N + n0;
        const int32_t* __restrict in = ap + r * N + n0;
        const float s = stp[r];
        if (bp)
          for (int64_t n = 0; n < width; ++n) out[n] = static_cast<float>(in[n]) * (s * scp[n0 + n]) + bp[n0 + n];
        else
          for (int64_t n = 0; n < width; ++n) out[n] = static_cast<float>(in[n]) * (s * scp[n0 + n]);
        for (int64_t j = 0; j < C; ++j) {
          const float v = wdp[r * C + j];
          const float* __restrict col = kpp + j * N + n0;
          for (int64_t n = 0; n < width; ++n) out[n] += v * col[n];
        }
      }
    }
  });
  return y;
}

// Which vector path this build runs (what the compiler was told the CPU has).
std::string isa() {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return "avx512-vnni";
#elif defined(__AVXVNNI__)
  return "avx-vnni";
#else
  return "avx2";
#endif
}

}  // namespace

TORCH_LIBRARY(pie_cpu, m) {
  m.def("isa() -> str");
  m.def("q4_linear(Tensor x, Tensor w, int n, Tensor? bias, bool fine=False) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor w, int n, Tensor? bias, bool fine=False) -> Tensor");
  m.def("q5_linear(Tensor x, Tensor w, int n, Tensor? bias, bool fine=False) -> Tensor");
  m.def("w8a8_quantise(Tensor x, int count) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("w8a8_finish(Tensor acc, Tensor step, Tensor scale, Tensor wide, Tensor kept, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(pie_cpu, CatchAll, m) { m.impl("isa", &isa); }

TORCH_LIBRARY_IMPL(pie_cpu, CPU, m) {
  m.impl("q4_linear", &q4_linear);
  m.impl("q8_linear", &q8_linear);
  m.impl("q5_linear", &q5_linear);
  m.impl("w8a8_quantise", &w8a8_quantise);
  m.impl("w8a8_finish", &w8a8_finish);
}
