// Attention over a packed batch for CPUs: texts laid end to end, delimited by cu_seqlens,
// each attending only to itself, with no padding and no per-length grouping.
//
// q [num_tokens, num_heads, head_dim], k and v [num_tokens, num_kv_heads, head_dim]: any
// row stride (views of one fused qkv projection are taken as they are), heads and
// head_dim contiguous within a row. Work item = a text (or, for few or long texts, a run
// of its kv heads), costliest first, handed out one at a time to whichever thread is free.
// An item first copies its rows out, reading each front to back: read head by head, the
// rows of a fused projection are kilobytes apart and every one misses cache and TLB.
// K is transposed on the way, its rows padded off a power of two. Vectors are as wide as
// the build's target: 16 floats with AVX-512, 8 with AVX2. Queries go in tiles of 12
// (AVX-512) or 6 (AVX2): scoring is broadcast-FMAs of the tile's queries against two
// vectors of keys (24 or 12 accumulators, no horizontal sums); P·V is broadcast-FMAs of
// the queries' weights against each value row, so each K or V load from L2 feeds 12 or
// 6 FMAs. SDPA's fused CPU kernel, by contrast, spends more on setup than on math for
// texts of tens of tokens.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#define BARGE_SIMD 1
#endif

namespace {

#ifdef BARGE_SIMD
// The few vector operations the kernel needs, at the widest width the build targets:
// 16 floats with AVX-512, 8 with AVX2.
namespace simd {
#ifdef __AVX512F__
using Vec = __m512;
using Mask = __mmask16;
constexpr int64_t kWidth = 16;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec x) { _mm512_storeu_ps(p, x); }
inline Vec set1(float x) { return _mm512_set1_ps(x); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Mask first_lanes(int64_t n) { return static_cast<Mask>((1u << n) - 1); }
inline Vec select(Mask m, Vec x, Vec otherwise) { return _mm512_mask_blend_ps(m, otherwise, x); }
inline float reduce_max(Vec x) { return _mm512_reduce_max_ps(x); }
inline float reduce_add(Vec x) { return _mm512_reduce_add_ps(x); }
inline Vec round(Vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec times_pow2(Vec y, Vec n) { return _mm512_scalef_ps(y, n); }     // y * 2^n, n integral
#else
using Vec = __m256;
using Mask = __m256;
constexpr int64_t kWidth = 8;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec x) { _mm256_storeu_ps(p, x); }
inline Vec set1(float x) { return _mm256_set1_ps(x); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Mask first_lanes(int64_t n) {
  return _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps(static_cast<float>(n)), _CMP_LT_OQ);
}
inline Vec select(Mask m, Vec x, Vec otherwise) { return _mm256_blendv_ps(otherwise, x, m); }
inline float reduce_max(Vec x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline float reduce_add(Vec x) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}
inline Vec round(Vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec times_pow2(Vec y, Vec n) {     // n integral, in [-126, 127]: 2^n by its exponent bits
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}
#endif

// e^x for x <= 0 (a softmax's shifted scores), lanewise: Cephes' expf, 2^n times a
// degree-5 polynomial on [-ln2/2, ln2/2]; within 2 ulp of expf.
inline Vec exp_nonpositive(Vec x) {
  x = max(x, set1(-87.3f));          // below: e^x underflows; 0 is as good
  const Vec n = round(mul(x, set1(1.44269504088896341f)));
  x = fmadd(n, set1(-0.693359375f), x);
  x = fmadd(n, set1(2.12194440e-4f), x);
  Vec y = set1(1.9875691500e-4f);
  y = fmadd(y, x, set1(1.3981999507e-3f));
  y = fmadd(y, x, set1(8.3334519073e-3f));
  y = fmadd(y, x, set1(4.1665795894e-2f));
  y = fmadd(y, x, set1(1.6666665459e-1f));
  y = fmadd(y, x, set1(5.0000001201e-1f));
  y = fmadd(y, mul(x, x), add(x, set1(1.f)));
  return times_pow2(y, n);
}
}  // namespace simd
constexpr int64_t kLanes = simd::kWidth;   // floats per vector
#else
constexpr int64_t kLanes = 8;
#endif

// Queries per tile: kRows x 2 vectors of accumulators, 2 vectors of keys and a broadcast
// fill the registers (32 with AVX-512, 16 with AVX2).
#ifdef __AVX512F__
constexpr int64_t kRows = 12;
#else
constexpr int64_t kRows = 6;
#endif
constexpr int64_t kKeyTile = 2 * kLanes;       // keys per score tile: kRows x 2 vectors of accumulators
constexpr int64_t kItemFloats = 1 << 20;       // an item's copies of q, k and v: at most 4 MiB, if heads allow

struct Item {
  int64_t seq, head_begin, head_end;          // kv heads [head_begin, head_end) of text seq
  int64_t cost;
};

inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

constexpr int64_t kAhead = 16;                 // tokens ahead the copy-out prefetches, into L2

// out[c * out_stride + j] = in[j * cols + c] for j < rows, 0 for rows <= j < width.
void transpose(const float* in, int64_t rows, int64_t cols, float* out, int64_t out_stride, int64_t width) {
  int64_t j = 0;
  for (; j + kLanes <= rows; j += kLanes) {
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t i = 0; i < kLanes; ++i) out[c * out_stride + j + i] = in[(j + i) * cols + c];
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t i = j; i < rows; ++i) out[c * out_stride + i] = in[i * cols + c];
    std::fill(out + c * out_stride + rows, out + c * out_stride + width, 0.f);
  }
}

// Ask for the cache lines of p[0:n], into L2.
inline void prefetch(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / sizeof(float)) __builtin_prefetch(p + i, 0, 1);
}

// scores[r * score_stride + 0:kKeyTile] = queries[r] · keys_t[:, 0:kKeyTile] for the tile's
// kRows queries (head_dim apart); keys_t row c holds key column c, key_stride apart.
inline void score_tile(const float* queries, const float* keys_t, int64_t key_stride, int64_t head_dim,
                       float* scores, int64_t score_stride) {
#ifdef BARGE_SIMD
  using namespace simd;
  Vec acc[kRows][2];
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = zero();
  for (int64_t c = 0; c < head_dim; ++c) {
    const Vec k0 = load(keys_t + c * key_stride);
    const Vec k1 = load(keys_t + c * key_stride + kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec q = set1(queries[r * head_dim + c]);
      acc[r][0] = fmadd(q, k0, acc[r][0]);
      acc[r][1] = fmadd(q, k1, acc[r][1]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    store(scores + r * score_stride, acc[r][0]);
    store(scores + r * score_stride + kLanes, acc[r][1]);
  }
#else
  for (int r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kKeyTile; ++j) {
      float sum = 0.f;
      for (int64_t c = 0; c < head_dim; ++c) sum += queries[r * head_dim + c] * keys_t[c * key_stride + j];
      scores[r * score_stride + j] = sum;
    }
  }
#endif
}

#ifdef BARGE_SIMD
// out[r * head_dim + 0 : V vectors] = sum_j weights[r * weight_stride + j] * values[j * head_dim + 0 : V vectors]
// for R queries sharing each value row, j in [0, count).
template <int R, int V>
inline void weigh_rows(const float* weights, int64_t weight_stride, const float* values, int64_t head_dim,
                       int64_t count, float* out) {
  using namespace simd;
  Vec acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < V; ++u) acc[r][u] = zero();
  for (int64_t j = 0; j < count; ++j) {
    const float* row = values + j * head_dim;
    Vec v[V];
    for (int u = 0; u < V; ++u) v[u] = load(row + u * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec w = set1(weights[r * weight_stride + j]);
      for (int u = 0; u < V; ++u) acc[r][u] = fmadd(w, v[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < V; ++u) store(out + r * head_dim + u * kLanes, acc[r][u]);
}
#endif

// out[r * head_dim + 0 : head_dim] = the weights of query r over `count` value rows, for the
// first `rows` (at most kRows) queries of `weights` (weight_stride apart). Columns go in
// tiles of 12 accumulators: 3 queries x 4 vectors, or 6 x 2, or 6 x 1 at the end.
void weigh_values(const float* weights, int64_t weight_stride, const float* values, int64_t count,
                  int64_t head_dim, int64_t rows, float* out) {
  int64_t d = 0;
#ifdef BARGE_SIMD
  for (; d + 4 * kLanes <= head_dim; d += 4 * kLanes) {
    for (int64_t r = 0; r < rows; r += 3) {
      weigh_rows<3, 4>(weights + r * weight_stride, weight_stride, values + d, head_dim, count, out + r * head_dim + d);
    }
  }
  for (; d + 2 * kLanes <= head_dim; d += 2 * kLanes) {
    weigh_rows<kRows, 2>(weights, weight_stride, values + d, head_dim, count, out + d);
  }
  for (; d + kLanes <= head_dim; d += kLanes) {
    weigh_rows<kRows, 1>(weights, weight_stride, values + d, head_dim, count, out + d);
  }
#endif
  for (; d < head_dim; ++d) {
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.f;
      for (int64_t j = 0; j < count; ++j) sum += weights[r * weight_stride + j] * values[j * head_dim + d];
      out[r * head_dim + d] = sum;
    }
  }
}

// row[0:count] = e^(row - max(row)); returns their sum. The row's buffer has a vector of
// slack past count: whole vectors are computed there, and masked out of max and sum.
float softmax_unnormalised(float* row, int64_t count) {
#ifdef BARGE_SIMD
  using namespace simd;
  const int64_t whole = count / kLanes * kLanes, tail = count - whole;
  const Mask in_tail = first_lanes(tail);
  const Vec lowest = set1(-3.0e38f);
  Vec top = lowest;
  for (int64_t j = 0; j < whole; j += kLanes) top = max(top, load(row + j));
  if (tail) top = max(top, select(in_tail, load(row + whole), lowest));
  const Vec shift = set1(reduce_max(top));
  Vec total = zero();
  for (int64_t j = 0; j < whole; j += kLanes) {
    const Vec e = exp_nonpositive(sub(load(row + j), shift));
    store(row + j, e);
    total = add(total, e);
  }
  if (tail) {
    const Vec e = select(in_tail, exp_nonpositive(sub(load(row + whole), shift)), zero());
    store(row + whole, e);
    total = add(total, e);
  }
  return reduce_add(total);
#else
  float top = row[0];
  for (int64_t j = 1; j < count; ++j) top = std::max(top, row[j]);
  float total = 0.f;
  for (int64_t j = 0; j < count; ++j) {
    row[j] = std::exp(row[j] - top);
    total += row[j];
  }
  return total;
#endif
}

void check_rows(const at::Tensor& x, const char* name, int64_t num_tokens, int64_t head_dim) {
  TORCH_CHECK(x.dim() == 3, name, " must be [num_tokens, heads, head_dim]");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "varlen_attention takes float32 tensors; ", name, " is ",
              x.scalar_type());
  TORCH_CHECK(x.size(0) == num_tokens && x.size(2) == head_dim, name, " has shape ", x.sizes(),
              ", not [", num_tokens, ", heads, ", head_dim, "]");
  TORCH_CHECK(x.stride(2) == 1 && (x.size(1) == 1 || x.stride(1) == head_dim),
              name, "'s heads and head_dim must be contiguous within a row");
}

at::Tensor varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& cu_seqlens, double scale, bool causal, int64_t half_window) {
  const int64_t num_tokens = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  check_rows(q, "q", num_tokens, head_dim);
  check_rows(k, "k", num_tokens, head_dim);
  check_rows(v, "v", num_tokens, head_dim);
  const int64_t num_kv_heads = k.size(1);
  TORCH_CHECK(v.size(1) == num_kv_heads, "k and v have different head counts");
  TORCH_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "num_heads (", num_heads,
              ") must be a multiple of num_kv_heads (", num_kv_heads, ")");
  const at::Tensor bounds = cu_seqlens.to(at::kLong).contiguous();
  TORCH_CHECK(bounds.dim() == 1 && bounds.numel() >= 1, "cu_seqlens must be [num_seqs + 1]");
  const int64_t* bound = bounds.data_ptr<int64_t>();
  const int64_t num_seqs = bounds.numel() - 1;
  TORCH_CHECK(bound[0] == 0 && bound[num_seqs] == num_tokens, "cu_seqlens must run from 0 to num_tokens (",
              num_tokens, "), got ", bound[0], " to ", bound[num_seqs]);
  for (int64_t s = 0; s < num_seqs; ++s) TORCH_CHECK(bound[s + 1] >= bound[s], "cu_seqlens must not decrease");

  const int64_t group_size = num_heads / num_kv_heads;
  at::Tensor out = at::empty({num_tokens, num_heads, head_dim}, q.options());
  const float* q_ptr = q.data_ptr<float>();
  const float* k_ptr = k.data_ptr<float>();
  const float* v_ptr = v.data_ptr<float>();
  float* out_ptr = out.data_ptr<float>();
  const int64_t q_row = q.stride(0), k_row = k.stride(0), v_row = v.stride(0);
  const float scale_f = static_cast<float>(scale);

  // An item is one text and a run of its kv heads: a whole text where texts are many, so
  // that its rows are read once, end to end; fewer heads where texts are few or long, so
  // that every thread has work and an item's copies stay within kItemFloats.
  const int64_t num_threads = at::get_num_threads();
  const int64_t spread = std::max<int64_t>(1, num_kv_heads * num_seqs / (4 * num_threads));
  std::vector<Item> items;
  for (int64_t seq = 0; seq < num_seqs; ++seq) {
    const int64_t len = bound[seq + 1] - bound[seq];
    if (len == 0) continue;
    const int64_t fits = kItemFloats / (round_up(len, kKeyTile) * head_dim * (3 + group_size));
    const int64_t heads = std::clamp<int64_t>(std::min(fits, spread), 1, num_kv_heads);
    for (int64_t head = 0; head < num_kv_heads; head += heads) {
      items.push_back({seq, head, std::min(head + heads, num_kv_heads), len * len * heads});
    }
  }
  // Costliest first, so the last items handed out are the cheap ones.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::atomic<size_t> next{0};

  // The keys a query sees: [lo, hi) of its text. Both ends never decrease with the query.
  auto key_range = [&](int64_t i, int64_t len) {
    int64_t lo = 0, hi = causal ? i + 1 : len;
    if (half_window >= 0) {
      lo = std::max<int64_t>(lo, i - half_window);
      hi = std::min<int64_t>(hi, i + half_window + 1);
    }
    return std::pair<int64_t, int64_t>{lo, hi};
  };

  at::parallel_for(0, num_threads, 1, [&](int64_t, int64_t) {
    std::vector<float> queries, keys, keys_t, values, scores, acc(kRows * head_dim);
    for (size_t index = next++; index < items.size(); index = next++) {
      const Item& item = items[index];
      const int64_t start = bound[item.seq], len = bound[item.seq + 1] - start;
      const int64_t heads = item.head_end - item.head_begin;
      const int64_t width = round_up(len, kKeyTile);
      // K's rows are a cache line longer than the keys: at a power-of-two width, rows
      // 4 KiB apart would share an L1 set, and a head's 32 or 64 rows thrash it.
      const int64_t key_stride = width + 64 / sizeof(float);
      // Copy this item's rows out once, each read front to back: queries scaled, [head, token, dim]
      // (a tile's spare rows read past the end: slack); keys and values [kv head, token, dim].
      // Then keys transposed, [kv head, dim, token], from that copy while it is in cache,
      // zeros past the text (score tiles are whole); P·V reads no value row past it.
      queries.resize((heads * group_size * len + kRows) * head_dim);
      keys.resize(heads * len * head_dim);
      keys_t.resize(heads * head_dim * key_stride);
      values.resize(heads * len * head_dim);
      const int64_t q_floats = heads * group_size * head_dim, kv_floats = heads * head_dim;
      for (int64_t j = 0; j < len; ++j) {
        const float* q_in = q_ptr + (start + j) * q_row + item.head_begin * group_size * head_dim;
        const float* k_in = k_ptr + (start + j) * k_row + item.head_begin * head_dim;
        const float* v_in = v_ptr + (start + j) * v_row + item.head_begin * head_dim;
        if (j + kAhead < len) {     // the projection's rows come from memory: ask ahead
          prefetch(q_in + kAhead * q_row, q_floats);
          prefetch(k_in + kAhead * k_row, kv_floats);
          prefetch(v_in + kAhead * v_row, kv_floats);
        }
        for (int64_t h = 0; h < heads * group_size; ++h) {
          float* target = queries.data() + (h * len + j) * head_dim;
          for (int64_t c = 0; c < head_dim; ++c) target[c] = q_in[h * head_dim + c] * scale_f;
        }
        for (int64_t h = 0; h < heads; ++h) {
          std::copy(k_in + h * head_dim, k_in + (h + 1) * head_dim, keys.data() + (h * len + j) * head_dim);
          std::copy(v_in + h * head_dim, v_in + (h + 1) * head_dim, values.data() + (h * len + j) * head_dim);
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        transpose(keys.data() + h * len * head_dim, len, head_dim, keys_t.data() + h * head_dim * key_stride,
                  key_stride, width);
      }
      const int64_t score_stride = width + 2 * kLanes;     // slack: softmax_unnormalised reads whole vectors
      scores.resize(kRows * score_stride);
      for (int64_t h = 0; h < heads * group_size; ++h) {
        const int64_t kv = h / group_size, head = item.head_begin * group_size + h;
        const float* head_keys = keys_t.data() + kv * head_dim * key_stride;
        const float* head_values = values.data() + kv * len * head_dim;
        for (int64_t first = 0; first < len; first += kRows) {
          const int64_t rows = std::min(kRows, len - first);
          // Every query of the tile is scored against the keys any of them sees; each then
          // keeps its own range, its weights zero outside it.
          const int64_t tile_lo = key_range(first, len).first / kKeyTile * kKeyTile;
          const int64_t tile_hi = round_up(key_range(first + rows - 1, len).second, kKeyTile);
          const float* tile_queries = queries.data() + (h * len + first) * head_dim;
          for (int64_t j = tile_lo; j < tile_hi; j += kKeyTile) {
            score_tile(tile_queries, head_keys + j, key_stride, head_dim, scores.data() + (j - tile_lo), score_stride);
          }
          float inverse[kRows];
          for (int64_t r = 0; r < kRows; ++r) {
            float* row = scores.data() + r * score_stride;
            if (r >= rows) {
              std::fill(row, row + (tile_hi - tile_lo), 0.f);
              continue;
            }
            const auto [lo, hi] = key_range(first + r, len);
            inverse[r] = 1.f / softmax_unnormalised(row + (lo - tile_lo), hi - lo);
            std::fill(row, row + (lo - tile_lo), 0.f);
            std::fill(row + (hi - tile_lo), row + (tile_hi - tile_lo), 0.f);
          }
          // Value rows past the last key any query sees would only add zeros.
          const int64_t tile_end = key_range(first + rows - 1, len).second;
          weigh_values(scores.data(), score_stride, head_values + tile_lo * head_dim, tile_end - tile_lo, head_dim,
                       rows, acc.data());
          for (int64_t r = 0; r < rows; ++r) {
            float* target = out_ptr + ((start + first + r) * num_heads + head) * head_dim;
            for (int64_t c = 0; c < head_dim; ++c) target[c] = acc[r * head_dim + c] * inverse[r];
          }
        }
      }
    }
  });
  return out;
}

}  // namespace

// The op namespace is a macro so that a test can load an AVX2 build beside the native one.
#ifndef BARGE_OPS_NAMESPACE
#define BARGE_OPS_NAMESPACE barge_cpu
#endif

TORCH_LIBRARY_FRAGMENT(BARGE_OPS_NAMESPACE, m) {
  m.def("varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale, bool causal, "
        "int half_window) -> Tensor");
}

TORCH_LIBRARY_IMPL(BARGE_OPS_NAMESPACE, CPU, m) { m.impl("varlen_attention", &varlen_attention); }
