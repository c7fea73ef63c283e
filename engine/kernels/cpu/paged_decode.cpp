// Paged decode attention for CPUs: one new query token per sequence, attending over its
// K/V where they lie in the block cache, read once, with no gathered copy and no padding.
//
// Layout (engine/generate/kv_cache.py): k_cache, v_cache [num_kv_heads, num_blocks, block_size, head_dim].
// Work item = (sequence, kv head): the group_size query heads served by one kv head share
// each K/V row while it is in L1. Pass 1 scores every context token, then a softmax per
// query head, then pass 2 accumulates the weighted V rows and normalises once at the end.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

inline void axpy(float w, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3, "q must be [num_seqs, num_heads, head_dim]");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "k_cache and v_cache must both be [num_kv_heads, num_blocks, block_size, head_dim]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat, "paged_decode takes float32 tensors");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "block_tables and context_lens must be int64");
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(0), num_blocks = k_cache.size(1), block_size = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim, "head_dim differs between q and the cache");
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == num_seqs && context_lens.numel() == num_seqs,
              "one block table row and one context length per sequence");
  const int64_t group_size = num_heads / num_kv_heads;
  const int64_t max_blocks = block_tables.size(1);

  const at::Tensor queries = q.contiguous();
  const at::Tensor tables = block_tables.contiguous();
  const at::Tensor lens = context_lens.contiguous();
  at::Tensor out = at::empty_like(queries);
  const float* q_ptr = queries.data_ptr<float>();
  const float* k_ptr = k_cache.data_ptr<float>();
  const float* v_ptr = v_cache.data_ptr<float>();
  const int64_t* table_ptr = tables.data_ptr<int64_t>();
  const int64_t* len_ptr = lens.data_ptr<int64_t>();
  float* out_ptr = out.data_ptr<float>();
  for (int64_t s = 0; s < num_seqs; ++s) {
    TORCH_CHECK(len_ptr[s] >= 1 && len_ptr[s] <= max_blocks * block_size,
                "context length ", len_ptr[s], " does not fit the block table");
  }

  const int64_t num_items = num_seqs * num_kv_heads;
  // Sequences come longest first; each thread gets a contiguous range of items, so pair
  // the i-th longest with the i-th shortest to give every range a similar amount of work.
  auto item_at = [num_items](int64_t i) { return (i % 2 == 0) ? i / 2 : num_items - 1 - i / 2; };

  at::parallel_for(0, num_items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(group_size * head_dim);
    std::vector<float> inverse(group_size);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t item = item_at(i);
      const int64_t seq = item / num_kv_heads, kv_head = item % num_kv_heads;
      const int64_t len = len_ptr[seq];
      const int64_t* table = table_ptr + seq * max_blocks;
      const float* query = q_ptr + (seq * num_heads + kv_head * group_size) * head_dim;
      const int64_t head_offset = kv_head * num_blocks;
      scores.resize(group_size * len);

      for (int64_t t = 0; t < len; ++t) {
        const int64_t row = (head_offset + table[t / block_size]) * block_size + t % block_size;
        const float* key = k_ptr + row * head_dim;
        for (int64_t g = 0; g < group_size; ++g) {
          scores[g * len + t] = dot(query + g * head_dim, key, head_dim) * static_cast<float>(scale);
        }
      }
      for (int64_t g = 0; g < group_size; ++g) {
        float* row = scores.data() + g * len;
        float top = row[0];
#pragma omp simd reduction(max : top)
        for (int64_t t = 0; t < len; ++t) top = std::max(top, row[t]);
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < len; ++t) {
          row[t] = std::exp(row[t] - top);     // vectorised (libmvec) under -ffast-math
          total += row[t];
        }
        inverse[g] = 1.f / total;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const int64_t row = (head_offset + table[t / block_size]) * block_size + t % block_size;
        const float* value = v_ptr + row * head_dim;
        for (int64_t g = 0; g < group_size; ++g) {
          axpy(scores[g * len + t], value, acc.data() + g * head_dim, head_dim);
        }
      }
      float* target = out_ptr + (seq * num_heads + kv_head * group_size) * head_dim;
      for (int64_t g = 0; g < group_size; ++g) {
        for (int64_t d = 0; d < head_dim; ++d) target[g * head_dim + d] = acc[g * head_dim + d] * inverse[g];
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(barge_cpu, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(barge_cpu, CPU, m) { m.impl("paged_decode", &paged_decode); }
