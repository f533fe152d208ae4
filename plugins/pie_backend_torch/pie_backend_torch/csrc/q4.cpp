// 4-bit weights times int8 activations on the CPU, and the steps around the w8a8 path's integer
// product, as torch operators (namespace pie_cpu). Built from this file on first use by
// pie_backend_torch/native.py with -march=native; the vector paths below are chosen by what the
// compiler was told the CPU has (AVX512-VNNI, AVX-VNNI, plain AVX2).
//
// Weight format (per linear, N outputs, K inputs, K % 32 == 0), made by native.pack_q4: one
// uint8 tensor [N, K/2 + 4 * K/32], a row per output, so that the weights stream from memory in
// one sequential pass. A row is
//   K/2 bytes   block b is bytes 16b..16b+15; byte j holds the block's input j in its low
//               nibble and input 16+j in its high nibble (q in 0..15)
//   K/32 halfs  scale per block
//   K/32 halfs  low per block: w = q * scale + low
// Activations are quantised per block of 32 inputs (symmetric, int8 in [-127, 127]), so an
// outlier channel costs precision only to its own block.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kPrefetchTiles = 8;

inline float half_to_float(at::Half h) { return _cvtsh_ss(h.x); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Unsigned bytes times signed bytes, summed in fours into 8 int32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline __m256i unpack_block(const uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

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

// Per block of one x row and one weight row: scale * x step, and the low-times-sum terms summed.
inline float block_scales(const at::Half* scale, const at::Half* low, const float* xstep, const float* xsum, int64_t nb, float* s) {
  __m256 corr = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + b)));
    const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(low + b)));
    _mm256_storeu_ps(s + b, _mm256_mul_ps(d, _mm256_loadu_ps(xstep + b)));
    corr = _mm256_fmadd_ps(m, _mm256_loadu_ps(xsum + b), corr);
  }
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  if (b < nb) {  // the last 1..7 blocks, masked
    const __mmask8 k = static_cast<__mmask8>((1u << (nb - b)) - 1);
    const __m256 d = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(k, scale + b));
    const __m256 m = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(k, low + b));
    _mm256_mask_storeu_ps(s + b, k, _mm256_mul_ps(d, _mm256_maskz_loadu_ps(k, xstep + b)));
    corr = _mm256_fmadd_ps(m, _mm256_maskz_loadu_ps(k, xsum + b), corr);
    b = nb;
  }
#endif
  float total = hsum(corr);
  for (; b < nb; ++b) {
    s[b] = half_to_float(scale[b]) * xstep[b];
    total += half_to_float(low[b]) * xsum[b];
  }
  return total;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// Two blocks (64 inputs) as unsigned bytes in input order: [lo0 hi0 lo1 hi1].
inline __m512i unpack_two(const uint8_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(raw, mask);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(lo, hi, 0x20)),
                            _mm256_permute2x128_si256(lo, hi, 0x31), 1);
}
#endif

// NR weight rows (consecutive, `stride` bytes apart) against R rows of x:
// out[r * ldo + j] = dot(x row r, weight row n + j) + bias[j]. Independent accumulators per pair
// keep the FMA chains apart; x is loaded once per block for all NR weight rows.
template <int NR, int R>
void dot_tile(const uint8_t* rows, int64_t stride, int64_t nb, const int8_t* xq, const float* xstep, const float* xsum, int64_t K, float* out, int64_t ldo,
              const float* bias, float* s /* [NR * R, nb] scratch */) {
  const int64_t K2 = K / 2;
  float total[NR][R];
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < R; ++r)
      total[j][r] = block_scales(reinterpret_cast<const at::Half*>(rows + j * stride + K2),
                                 reinterpret_cast<const at::Half*>(rows + j * stride + K2) + nb, xstep + r * nb, xsum + r * nb, nb, s + (j * R + r) * nb);
  int64_t b = 0;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  {
    __m512 acc[NR][R];
    for (int j = 0; j < NR; ++j)
      for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
    const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (; b + 2 <= nb; b += 2) {
      __m512i x[R];
      for (int r = 0; r < R; ++r) x[r] = _mm512_loadu_si512(xq + r * K + b * kBlock);
      for (int j = 0; j < NR; ++j) {
        const __m512i w = unpack_two(rows + j * stride + b * 16);
        for (int r = 0; r < R; ++r) {
          const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x[r]);
          const float* sp = s + (j * R + r) * nb + b;
          const __m512 sv = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sp)))));
          acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sv, acc[j][r]);
        }
      }
    }
    for (int j = 0; j < NR; ++j)
      for (int r = 0; r < R; ++r) total[j][r] += _mm512_reduce_add_ps(acc[j][r]);
  }
#endif
  __m256 acc[NR][R];
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm256_setzero_ps();
  for (; b < nb; ++b) {
    __m256i x[R];
    for (int r = 0; r < R; ++r) x[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + b * kBlock));
    for (int j = 0; j < NR; ++j) {
      const __m256i w = unpack_block(rows + j * stride + b * 16);
      for (int r = 0; r < R; ++r)
        acc[j][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(w, x[r])), _mm256_broadcast_ss(s + (j * R + r) * nb + b), acc[j][r]);
    }
  }
  for (int j = 0; j < NR; ++j)
    for (int r = 0; r < R; ++r) out[r * ldo + j] = total[j][r] + hsum(acc[j][r]) + (bias ? bias[j] : 0.0f);
}

// Weight rows [n0, n1) against all M rows of x, in tiles of 4 weight rows by 2 x rows.
void dot_range(const uint8_t* w, int64_t stride, int64_t nb, const int8_t* xq, const float* xstep, const float* xsum,
               int64_t M, int64_t K, int64_t N, float* y, const float* bias, int64_t n0, int64_t n1) {
  std::vector<float> scratch(8 * nb);
  float* s = scratch.data();
  auto bias_at = [&](int64_t n) { return bias ? bias + n : nullptr; };
  int64_t n = n0;
  const int64_t tile = 4 * stride;
  const uint8_t* end = w + n1 * stride;
  for (const uint8_t* p = w + n * stride; p < w + n * stride + kPrefetchTiles * tile && p < end; p += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
  for (; n + 4 <= n1; n += 4) {
    // the weights stream from memory once per step: ask for the tile kPrefetchTiles ahead now
    const uint8_t* ahead = w + n * stride + kPrefetchTiles * tile;
    for (const uint8_t* p = ahead; p < ahead + tile && p < end; p += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
    int64_t r = 0;
    for (; r + 2 <= M; r += 2)
      dot_tile<4, 2>(w + n * stride, stride, nb, xq + r * K, xstep + r * nb, xsum + r * nb, K, y + r * N + n, N, bias_at(n), s);
    for (; r < M; ++r)
      dot_tile<4, 1>(w + n * stride, stride, nb, xq + r * K, xstep + r * nb, xsum + r * nb, K, y + r * N + n, N, bias_at(n), s);
  }
  for (; n < n1; ++n)
    for (int64_t r = 0; r < M; ++r)
      dot_tile<1, 1>(w + n * stride, stride, nb, xq + r * K, xstep + r * nb, xsum + r * nb, K, y + r * N + n, N, bias_at(n), s);
}

int64_t row_bytes(int64_t K) { return K / 2 + 4 * (K / kBlock); }

at::Tensor q4_linear(const at::Tensor& x_in, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu(), "q4_linear: x must be a 2-D CPU tensor");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), nb = K / kBlock;
  TORCH_CHECK(K % kBlock == 0, "q4_linear: in_features must be a multiple of 32, got ", K);
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.size(1) == row_bytes(K),
              "q4_linear: weights must be contiguous uint8 [N, ", row_bytes(K), "] for in_features ", K);
  at::Tensor b32;
  if (bias.has_value()) {
    b32 = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b32.numel() == N, "q4_linear: bias must have N elements");
  }
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  at::Tensor xq = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor xstep = at::empty({M, nb}, x.options());
  at::Tensor xsum = at::empty({M, nb}, x.options());
  const float* xp = x.data_ptr<float>();
  int8_t* xqp = xq.data_ptr<int8_t>();
  float* sp = xstep.data_ptr<float>();
  float* up = xsum.data_ptr<float>();
  at::parallel_for(0, M, M >= 16 ? 1 : M, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quantise_row(xp + r * K, K, xqp + r * K, sp + r * nb, up + r * nb);
  });
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* bp = bias.has_value() ? b32.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    dot_range(wp, row_bytes(K), nb, xqp, sp, up, M, K, N, yp, bp, n0, n1);
  });
  return y;
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
  std::vector<float> peak(K, 0.0f);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) peak[k] = std::max(peak[k], std::fabs(xp[r * K + k]));
  std::vector<int64_t> order(K);
  for (int64_t k = 0; k < K; ++k) order[k] = k;
  std::nth_element(order.begin(), order.begin() + count, order.end(), [&](int64_t a, int64_t b) {
    return peak[a] > peak[b] || (peak[a] == peak[b] && a < b);
  });
  order.resize(count);
  std::sort(order.begin(), order.end());
  at::Tensor outliers = at::empty({count}, x.options().dtype(at::kLong));
  std::copy(order.begin(), order.end(), outliers.data_ptr<int64_t>());
  std::vector<uint8_t> is_outlier(K, 0);
  for (int64_t k : order) is_outlier[k] = 1;
  at::Tensor wide = at::empty({M, count}, x.options());
  at::Tensor xq = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor step = at::empty({M, 1}, x.options());
  float* wp = wide.data_ptr<float>();
  int8_t* qp = xq.data_ptr<int8_t>();
  float* sp = step.data_ptr<float>();
  at::parallel_for(0, M, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = xp + r * K;
      float amax = 0.0f;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, is_outlier[k] ? 0.0f : std::fabs(row[k]));
      const float d = std::max(amax, 1e-12f) / 127.0f;
      const float inv = 1.0f / d;
      for (int64_t k = 0; k < K; ++k)
        qp[r * K + k] = is_outlier[k] ? 0 : static_cast<int8_t>(std::nearbyint(row[k] * inv));
      for (int64_t j = 0; j < count; ++j) wp[r * count + j] = row[order[j]];
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

}  // namespace

TORCH_LIBRARY(pie_cpu, m) {
  m.def("q4_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor");
  m.def("w8a8_quantise(Tensor x, int count) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("w8a8_finish(Tensor acc, Tensor step, Tensor scale, Tensor wide, Tensor kept, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(pie_cpu, CPU, m) {
  m.impl("q4_linear", &q4_linear);
  m.impl("w8a8_quantise", &w8a8_quantise);
  m.impl("w8a8_finish", &w8a8_finish);
}
