// The grouped LoRA delta of one projection (pie_cpu::lora_add), in the style of Punica's SGMV:
// every adapter group of a batch in one call, tokens given group by group, each group's weights
// (bfloat16, widened to float32 in registers, or float32) read once per group, float32
// accumulation, and the delta added to the projection's output (float32 or bfloat16, rounded
// once) in place. Built with q4.cpp by
// pie_backend_torch/native.py.
//
// Per group g (its tokens tokens[indptr[g]:indptr[g+1]]): a[g] [P*k, in] holds the P parts' A,
// b[g] [P, k, width] each part's (scaling * B).T (pie_backend_torch/lora_weights.py), with
// P * width == out's columns. An empty a[g] is a group that leaves this projection alone.
//   shrink:  u[t] = a[g] @ x[t]                          (float32, [P*k] per token)
//   expand:  out[t, p*width:(p+1)*width] += u[t, p*k:(p+1)*k] @ b[g][p]
// The shrink runs over groups; the expand over (group, part, 256 columns), so each thread owns
// distinct output columns of distinct tokens, and a group's tokens share each B chunk in L1.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__)
using vec = __m512;
constexpr int64_t V = 16;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset(float f) { return _mm512_set1_ps(f); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vload(const c10::BFloat16* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline void vstore(c10::BFloat16* p, vec v) {  // round to nearest even, as c10::BFloat16 does
  __m512i i = _mm512_castps_si512(v);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(i, 16), _mm512_set1_epi32(1));
  i = _mm512_srli_epi32(_mm512_add_epi32(i, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(i));
}
#else  // AVX2 (native.py builds nothing for a CPU without it)
using vec = __m256;
constexpr int64_t V = 8;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset(float f) { return _mm256_set1_ps(f); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline float vsum(vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vload(const c10::BFloat16* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline void vstore(c10::BFloat16* p, vec v) {
  __m256i i = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(i, 16), _mm256_set1_epi32(1));
  i = _mm256_srli_epi32(_mm256_add_epi32(i, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  __m128i lo = _mm256_castsi256_si128(i), hi = _mm256_extracti128_si256(i, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(lo, hi));
}
#endif

using bf16 = c10::BFloat16;
constexpr int64_t kTile = 4;     // tokens per register tile
constexpr int64_t kCols = 256;   // output columns per expand work item
// Below this many multiply-adds a call runs on one thread: a decode step's delta takes ~0.1 ms,
// which a second thread barely shortens, and a parallel region on a loaded machine can wait
// milliseconds for a descheduled thread.
constexpr int64_t kParallelWork = int64_t{1} << 24;

// Register tiles: T tokens by kRows rows of a (shrink) or kVecs vectors of columns (expand), so
// that each load feeds several multiply-adds (16 accumulators of 32 zmm; 8 of 16 ymm on AVX2).
constexpr int kRows = V == 16 ? 4 : 2;
constexpr int kVecs = V == 16 ? 4 : 2;

// u[t][j0 + r] = a[j0 + r] . x[tok[t]] for T tokens and R rows.
template <int T, int R, typename W>
void shrink_rows(const float* x, int64_t ldx, const int64_t* tok, const W* a, int64_t j0, int64_t in, float* u,
                 int64_t ldu) {
  vec acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = vzero();
  int64_t c = 0;
  for (; c + V <= in; c += V) {
    vec xv[T];
    for (int t = 0; t < T; ++t) xv[t] = vload(x + tok[t] * ldx + c);
    for (int r = 0; r < R; ++r) {
      vec wv = vload(a + (j0 + r) * in + c);
      for (int t = 0; t < T; ++t) acc[t][r] = vfma(wv, xv[t], acc[t][r]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      const W* w = a + (j0 + r) * in;
      float s = vsum(acc[t][r]);
      for (int64_t i = c; i < in; ++i) s += static_cast<float>(w[i]) * x[tok[t] * ldx + i];
      u[t * ldu + j0 + r] = s;
    }
}

template <int T, typename W>
void shrink_tile(const float* x, int64_t ldx, const int64_t* tok, const W* a, int64_t rows, int64_t in,
                 float* u, int64_t ldu) {
  int64_t j = 0;
  for (; j + kRows <= rows; j += kRows) shrink_rows<T, kRows>(x, ldx, tok, a, j, in, u, ldu);
  for (; j < rows; ++j) shrink_rows<T, 1>(x, ldx, tok, a, j, in, u, ldu);
}

// out[tok[t], c:c + C*V] += u[t, :k] @ b[:, c:c + C*V] for T tokens.
template <int T, int C, typename W, typename Out>
void expand_vecs(const float* u, int64_t ldu, const W* b, int64_t k, int64_t width, int64_t c, Out* out, int64_t ldo,
                 const int64_t* tok) {
  vec acc[T][C];
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < C; ++q) acc[t][q] = vzero();
  for (int64_t j = 0; j < k; ++j) {
    vec wv[C];
    for (int q = 0; q < C; ++q) wv[q] = vload(b + j * width + c + q * V);
    for (int t = 0; t < T; ++t) {
      vec uv = vset(u[t * ldu + j]);
      for (int q = 0; q < C; ++q) acc[t][q] = vfma(uv, wv[q], acc[t][q]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int q = 0; q < C; ++q) {
      Out* o = out + tok[t] * ldo + c + q * V;
      vstore(o, vadd(vload(o), acc[t][q]));
    }
}

// out[tok[t], c0:c1] += u[t, :k] @ b[:, c0:c1] for T tokens (columns of one part).
template <int T, typename W, typename Out>
void expand_tile(const float* u, int64_t ldu, const W* b, int64_t k, int64_t width, int64_t c0, int64_t c1,
                 Out* out, int64_t ldo, const int64_t* tok) {
  int64_t c = c0;
  for (; c + kVecs * V <= c1; c += kVecs * V) expand_vecs<T, kVecs>(u, ldu, b, k, width, c, out, ldo, tok);
  for (; c + V <= c1; c += V) expand_vecs<T, 1>(u, ldu, b, k, width, c, out, ldo, tok);
  for (; c < c1; ++c) {
    for (int t = 0; t < T; ++t) {
      float s = 0.f;
      for (int64_t j = 0; j < k; ++j) s += u[t * ldu + j] * static_cast<float>(b[j * width + c]);
      Out* o = out + tok[t] * ldo + c;
      *o = static_cast<Out>(static_cast<float>(*o) + s);
    }
  }
}

template <typename Fn>
void by_tiles(int64_t n, Fn&& fn) {  // fn(std::integral_constant<int, T>, first) over tiles of kTile
  int64_t i = 0;
  for (; i + kTile <= n; i += kTile) fn(std::integral_constant<int, kTile>{}, i);
  switch (n - i) {
    case 3: fn(std::integral_constant<int, 3>{}, i); break;
    case 2: fn(std::integral_constant<int, 2>{}, i); break;
    case 1: fn(std::integral_constant<int, 1>{}, i); break;
    default: break;
  }
}

template <typename W, typename Out>
void lora_add_impl(const at::Tensor& x, at::Tensor& out, const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                   const int64_t* tokens, const int64_t* indptr, int64_t groups, int64_t ldu) {
  const int64_t in = x.size(1), ldx = x.stride(0), ldo = out.stride(0);
  const float* xp = x.const_data_ptr<float>();
  Out* op = static_cast<Out*>(out.data_ptr());
  std::vector<float> u(static_cast<size_t>(indptr[groups] * ldu));
  int64_t work = 0;
  for (int64_t g = 0; g < groups; ++g)
    if (a[g].numel() != 0) work += (indptr[g + 1] - indptr[g]) * (a[g].size(0) * in + b[g].size(1) * b[g].size(0) * b[g].size(2));
  const bool threaded = work >= kParallelWork;
  at::parallel_for(0, groups, threaded ? 1 : groups, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      if (a[g].numel() == 0) continue;
      const W* ap = static_cast<const W*>(a[g].const_data_ptr());
      const int64_t rows = a[g].size(0), first = indptr[g];
      by_tiles(indptr[g + 1] - first, [&](auto T, int64_t i) {
        shrink_tile<decltype(T)::value, W>(xp, ldx, tokens + first + i, ap, rows, in, u.data() + (first + i) * ldu, ldu);
      });
    }
  });
  struct Item { int64_t g, p, c0; };  // (group, part, first of kCols columns), groups holding the projection
  std::vector<Item> items;
  for (int64_t g = 0; g < groups; ++g) {
    if (a[g].numel() == 0 || indptr[g + 1] == indptr[g]) continue;
    for (int64_t p = 0; p < b[g].size(0); ++p)
      for (int64_t c = 0; c < b[g].size(2); c += kCols) items.push_back({g, p, c});
  }
  const int64_t count = static_cast<int64_t>(items.size());
  at::parallel_for(0, count, threaded ? 1 : std::max<int64_t>(count, 1), [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t g = items[w].g, p = items[w].p, c0 = items[w].c0;
      const int64_t k = b[g].size(1), width = b[g].size(2), first = indptr[g];
      const W* bp = static_cast<const W*>(b[g].const_data_ptr()) + p * k * width;
      by_tiles(indptr[g + 1] - first, [&](auto T, int64_t i) {
        expand_tile<decltype(T)::value, W, Out>(u.data() + (first + i) * ldu + p * k, ldu, bp, k, width, c0,
                                        std::min(c0 + kCols, width), op + p * width, ldo, tokens + first + i);
      });
    }
  });
}

// out[t] += B_g A_g x[t] for every token t of every group g (see the top of this file).
void lora_add(const at::Tensor& x_in, at::Tensor out, at::TensorList a, at::TensorList b, const at::Tensor& tokens,
              const at::Tensor& indptr) {
  TORCH_CHECK(x_in.dim() == 2 && out.dim() == 2 && x_in.size(0) == out.size(0), "lora_add: x [N, in] and out [N, out]");
  TORCH_CHECK(out.stride(1) == 1, "lora_add: out's rows must be contiguous");
  TORCH_CHECK(out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16, "lora_add: out must be float32 or bfloat16");
  TORCH_CHECK(a.size() == b.size() && indptr.numel() == static_cast<int64_t>(a.size()) + 1,
              "lora_add: one a and one b per group, indptr of groups + 1");
  TORCH_CHECK(tokens.scalar_type() == at::kLong && indptr.scalar_type() == at::kLong, "lora_add: int64 tokens and indptr");
  at::Tensor x = x_in.scalar_type() == at::kFloat && x_in.stride(1) == 1 ? x_in : x_in.to(at::kFloat).contiguous();
  at::Tensor tok = tokens.contiguous(), ptr = indptr.contiguous();
  const int64_t groups = static_cast<int64_t>(a.size()), n = out.size(0), in = x.size(1);
  const int64_t* tp = tok.data_ptr<int64_t>();
  const int64_t* pp = ptr.data_ptr<int64_t>();
  TORCH_CHECK(pp[0] == 0 && pp[groups] == tok.numel(), "lora_add: indptr must run from 0 to len(tokens)");
  for (int64_t i = 0; i < tok.numel(); ++i) TORCH_CHECK(tp[i] >= 0 && tp[i] < n, "lora_add: token ", tp[i], " outside 0..", n - 1);
  std::vector<at::Tensor> as, bs;
  int64_t ldu = 1;
  at::ScalarType wtype = at::kFloat;
  for (int64_t g = 0; g < groups; ++g)
    if (a[g].numel() != 0) wtype = a[g].scalar_type();
  for (int64_t g = 0; g < groups; ++g) {
    TORCH_CHECK(pp[g + 1] >= pp[g], "lora_add: indptr must not decrease");
    as.push_back(a[g].contiguous());
    bs.push_back(b[g].contiguous());
    if (as[g].numel() == 0) continue;
    TORCH_CHECK(as[g].scalar_type() == wtype && bs[g].scalar_type() == wtype,
                "lora_add: every group's weights must be float32, or every group's bfloat16");
    TORCH_CHECK(as[g].dim() == 2 && as[g].size(1) == in && bs[g].dim() == 3 &&
                    bs[g].size(0) * bs[g].size(1) == as[g].size(0) && bs[g].size(0) * bs[g].size(2) == out.size(1),
                "lora_add: group ", g, " has a ", as[g].sizes(), " and b ", bs[g].sizes(), " for x ", x.sizes(),
                " and out ", out.sizes());
    ldu = std::max(ldu, as[g].size(0));
  }
  const bool wide = wtype == at::kFloat, out_wide = out.scalar_type() == at::kFloat;
  if (wide && out_wide) lora_add_impl<float, float>(x, out, as, bs, tp, pp, groups, ldu);
  if (wide && !out_wide) lora_add_impl<float, bf16>(x, out, as, bs, tp, pp, groups, ldu);
  if (!wide && out_wide) lora_add_impl<bf16, float>(x, out, as, bs, tp, pp, groups, ldu);
  if (!wide && !out_wide) lora_add_impl<bf16, bf16>(x, out, as, bs, tp, pp, groups, ldu);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pie_cpu, m) {
  m.def("lora_add(Tensor x, Tensor(a!) out, Tensor[] a, Tensor[] b, Tensor tokens, Tensor indptr) -> ()");
}

TORCH_LIBRARY_IMPL(pie_cpu, CPU, m) { m.impl("lora_add", &lora_add); }
