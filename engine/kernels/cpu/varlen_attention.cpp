// Attention over a packed batch for CPUs: texts laid end to end, delimited by cu_seqlens,
// each attending only to itself, with no padding and no per-length grouping.
//
// q [num_tokens, num_heads, head_dim], k and v [num_tokens, num_kv_heads, head_dim]: any
// row stride (views of one fused qkv projection are taken as they are), heads and
// head_dim contiguous within a row. Work item = a text (or, for few or long texts, a run
// of its kv heads), costliest first, handed out one at a time to whichever thread is free.
// An item first copies its rows out, reading each front to back: read head by head, the
// rows of a fused projection are kilobytes apart and every one misses cache and TLB.
// K is transposed on the way. Queries go in tiles of six: scoring is broadcast-FMAs of
// six queries against 16 keys (12 accumulators, no horizontal sums); P·V is
// broadcast-FMAs of three queries' weights against each value row (12 accumulators), so
// each K or V load from L2 feeds 6 or 3 FMAs. SDPA's fused CPU kernel, by contrast,
// spends more on setup than on math for texts of tens of tokens.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define BARGE_AVX2 1
#endif

namespace {

constexpr int64_t kLanes = 8;                  // floats per 256-bit vector
constexpr int64_t kRows = 6;                   // queries per tile
constexpr int64_t kKeyTile = 16;               // keys per score tile: kRows x 2 vectors of accumulators
constexpr int64_t kValueRows = 3;              // queries per P·V tile
constexpr int64_t kValueTile = 32;             // head_dim columns per P·V tile: kValueRows x 4 vectors
static_assert(kRows % kValueRows == 0, "a tile's queries split into P·V tiles");
constexpr int64_t kItemFloats = 1 << 20;       // an item's copies of q, k and v: at most 4 MiB, if heads allow

struct Item {
  int64_t seq, head_begin, head_end;          // kv heads [head_begin, head_end) of text seq
  int64_t cost;
};

inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// scores[r * score_stride + 0:16] = queries[r] · keys_t[:, 0:16] for the tile's kRows queries
// (head_dim apart); keys_t row c holds key column c, key_stride apart.
inline void score_tile(const float* queries, const float* keys_t, int64_t key_stride, int64_t head_dim,
                       float* scores, int64_t score_stride) {
#ifdef BARGE_AVX2
  __m256 acc[kRows][2];
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < head_dim; ++c) {
    const __m256 k0 = _mm256_loadu_ps(keys_t + c * key_stride);
    const __m256 k1 = _mm256_loadu_ps(keys_t + c * key_stride + kLanes);
    for (int r = 0; r < kRows; ++r) {
      const __m256 q = _mm256_broadcast_ss(queries + r * head_dim + c);
      acc[r][0] = _mm256_fmadd_ps(q, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(q, k1, acc[r][1]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    _mm256_storeu_ps(scores + r * score_stride, acc[r][0]);
    _mm256_storeu_ps(scores + r * score_stride + kLanes, acc[r][1]);
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

#ifdef BARGE_AVX2
// out[r * head_dim + 0 : V*8] = sum_j weights[r * weight_stride + j] * values[j * head_dim + 0 : V*8]
// for R queries sharing each value row, j in [0, count).
template <int R, int V>
inline void weigh_rows(const float* weights, int64_t weight_stride, const float* values, int64_t head_dim,
                       int64_t count, float* out) {
  __m256 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < V; ++u) acc[r][u] = _mm256_setzero_ps();
  for (int64_t j = 0; j < count; ++j) {
    const float* row = values + j * head_dim;
    __m256 v[V];
    for (int u = 0; u < V; ++u) v[u] = _mm256_loadu_ps(row + u * kLanes);
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(weights + r * weight_stride + j);
      for (int u = 0; u < V; ++u) acc[r][u] = _mm256_fmadd_ps(w, v[u], acc[r][u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < V; ++u) _mm256_storeu_ps(out + r * head_dim + u * kLanes, acc[r][u]);
}
#endif

// out[r * head_dim + 0 : head_dim] = the weights of query r over `count` value rows, for the
// kValueRows queries from `weights` (weight_stride apart).
void weigh_values(const float* weights, int64_t weight_stride, const float* values, int64_t count,
                  int64_t head_dim, float* out) {
  int64_t d = 0;
#ifdef BARGE_AVX2
  for (; d + kValueTile <= head_dim; d += kValueTile) {
    weigh_rows<kValueRows, kValueTile / kLanes>(weights, weight_stride, values + d, head_dim, count, out + d);
  }
  for (; d + kLanes <= head_dim; d += kLanes) {
    weigh_rows<kValueRows, 1>(weights, weight_stride, values + d, head_dim, count, out + d);
  }
#endif
  for (; d < head_dim; ++d) {
    for (int64_t r = 0; r < kValueRows; ++r) {
      float sum = 0.f;
      for (int64_t j = 0; j < count; ++j) sum += weights[r * weight_stride + j] * values[j * head_dim + d];
      out[r * head_dim + d] = sum;
    }
  }
}

#ifdef BARGE_AVX2
// e^x for x <= 0 (a softmax's shifted scores), lanewise: Cephes' expf, 2^n by the exponent
// bits and a degree-5 polynomial on [-ln2/2, ln2/2]; within 2 ulp of expf.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));          // below: e^x underflows; 0 is as good
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

inline float horizontal_max(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float horizontal_sum(__m256 x) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}
#endif

// row[0:count] = e^(row - max(row)); returns their sum. The row's buffer has 8 floats of
// slack past count: whole vectors are computed there, and masked out of max and sum.
float softmax_unnormalised(float* row, int64_t count) {
#ifdef BARGE_AVX2
  const int64_t whole = count / kLanes * kLanes, tail = count - whole;
  const __m256 lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 in_tail = _mm256_cmp_ps(lanes, _mm256_set1_ps(static_cast<float>(tail)), _CMP_LT_OQ);
  const __m256 lowest = _mm256_set1_ps(-3.0e38f);
  __m256 top = lowest;
  for (int64_t j = 0; j < whole; j += kLanes) top = _mm256_max_ps(top, _mm256_loadu_ps(row + j));
  if (tail) top = _mm256_max_ps(top, _mm256_blendv_ps(lowest, _mm256_loadu_ps(row + whole), in_tail));
  const __m256 shift = _mm256_set1_ps(horizontal_max(top));
  __m256 total = _mm256_setzero_ps();
  for (int64_t j = 0; j < whole; j += kLanes) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), shift));
    _mm256_storeu_ps(row + j, e);
    total = _mm256_add_ps(total, e);
  }
  if (tail) {
    const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + whole), shift)), in_tail);
    _mm256_storeu_ps(row + whole, e);
    total = _mm256_add_ps(total, e);
  }
  return horizontal_sum(total);
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
    const int64_t fits = kItemFloats / (round_up(len, kLanes) * head_dim * (2 + group_size));
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
    std::vector<float> queries, keys_t, values, scores, acc(kRows * head_dim);
    for (size_t index = next++; index < items.size(); index = next++) {
      const Item& item = items[index];
      const int64_t start = bound[item.seq], len = bound[item.seq + 1] - start;
      const int64_t heads = item.head_end - item.head_begin;
      const int64_t width = round_up(len, kKeyTile);
      // Copy this item's rows out once, each read front to back: queries scaled, [head, token, dim]
      // (a tile's spare rows read past the end: slack); keys transposed, [kv head, dim, token];
      // values [kv head, token, dim]. Keys and values past the text are zeros.
      queries.resize((heads * group_size * len + kRows) * head_dim);
      keys_t.assign(heads * head_dim * width, 0.f);
      values.assign(heads * width * head_dim, 0.f);
      for (int64_t j = 0; j < len; ++j) {
        const float* q_in = q_ptr + (start + j) * q_row + item.head_begin * group_size * head_dim;
        const float* k_in = k_ptr + (start + j) * k_row + item.head_begin * head_dim;
        const float* v_in = v_ptr + (start + j) * v_row + item.head_begin * head_dim;
        for (int64_t h = 0; h < heads * group_size; ++h) {
          float* target = queries.data() + (h * len + j) * head_dim;
          for (int64_t c = 0; c < head_dim; ++c) target[c] = q_in[h * head_dim + c] * scale_f;
        }
        for (int64_t h = 0; h < heads; ++h) {
          float* key_column = keys_t.data() + h * head_dim * width + j;
          for (int64_t c = 0; c < head_dim; ++c) key_column[c * width] = k_in[h * head_dim + c];
          std::copy_n(v_in + h * head_dim, head_dim, values.data() + (h * width + j) * head_dim);
        }
      }
      const int64_t score_stride = width + 2 * kLanes;     // slack: softmax_unnormalised reads whole vectors
      scores.resize(kRows * score_stride);
      for (int64_t h = 0; h < heads * group_size; ++h) {
        const int64_t kv = h / group_size, head = item.head_begin * group_size + h;
        const float* head_keys = keys_t.data() + kv * head_dim * width;
        const float* head_values = values.data() + kv * width * head_dim;
        for (int64_t first = 0; first < len; first += kRows) {
          const int64_t rows = std::min(kRows, len - first);
          // Every query of the tile is scored against the keys any of them sees; each then
          // keeps its own range, its weights zero outside it.
          const int64_t tile_lo = key_range(first, len).first / kKeyTile * kKeyTile;
          const int64_t tile_hi = round_up(key_range(first + rows - 1, len).second, kKeyTile);
          const float* tile_queries = queries.data() + (h * len + first) * head_dim;
          for (int64_t j = tile_lo; j < tile_hi; j += kKeyTile) {
            score_tile(tile_queries, head_keys + j, width, head_dim, scores.data() + (j - tile_lo), score_stride);
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
          for (int64_t r = 0; r < rows; r += kValueRows) {
            weigh_values(scores.data() + r * score_stride, score_stride, head_values + tile_lo * head_dim,
                         tile_hi - tile_lo, head_dim, acc.data() + r * head_dim);
          }
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

TORCH_LIBRARY_FRAGMENT(barge_cpu, m) {
  m.def("varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale, bool causal, "
        "int half_window) -> Tensor");
}

TORCH_LIBRARY_IMPL(barge_cpu, CPU, m) { m.impl("varlen_attention", &varlen_attention); }
