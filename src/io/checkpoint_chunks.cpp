// Chunk shapes and the size of a checkpoint file (CheckpointWriter stores tensors so).

#include "checkpoint_chunks.hpp"
#include "checkpoint_direct.hpp"

#include "cubelm/io/checkpoint.hpp"

#include <algorithm>
#include <numeric>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace cubelm::io {

namespace chunking {

// The chunk shape of a tensor of `dims`: whole rows, at most kChunkElements (4 MiB of
// float32) per chunk, so that a damaged byte is found and named per chunk, and the rows
// spread evenly over as few chunks as that allows. HDF5 allocates every chunk whole, so
// chunks of the most rows would leave the last one mostly padding ([768, 3072]: three
// chunks of 341 rows hold 1023, a quarter of them padding; three of 256 hold the 768).
namespace {
constexpr hsize_t kChunkElements = hsize_t(1) << 20;
} // namespace

std::vector<hsize_t> chunk_of(const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> chunk = dims;
  hsize_t row = 1;
  for (std::size_t d = 1; d < dims.size(); ++d)
    row *= std::max<hsize_t>(dims[d], 1);
  if (!chunk.empty() && dims[0] > 0) {
    const hsize_t most = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], kChunkElements / row));
    const hsize_t count = (dims[0] + most - 1) / most;
    chunk[0] = (dims[0] + count - 1) / count;
    // Chunks of whole file blocks where a few more rows allow it, padding the last chunk
    // by at most 1% of the tensor ([50257, 768]: 37 chunks of 1360 rows, not 1359): the
    // one writer then finds every chunk of a tensor on a block boundary in its slab as in
    // the file, and its driver writes them from there, not from a copy.
    if (count > 1) {
      const hsize_t block = direct::kAlignment / sizeof(float);
      const hsize_t multiple = block / std::gcd(row, block);
      const hsize_t rounded = (chunk[0] + multiple - 1) / multiple * multiple;
      if (rounded <= most && 100 * (count * rounded - dims[0]) <= dims[0])
        chunk[0] = rounded;
    }
  }
  for (auto& c : chunk)
    c = std::max<hsize_t>(c, 1);
  return chunk;
}

// HDF5 sums 16-bit big-endian words, sum1 += w and sum2 += sum1 word by word, and folds
// both sums to 16 bits after every 360 words (where neither can overflow) and at the end.
// Over a run of n words from (s1, s2), the same arithmetic without the chain:
// s1 + sum(w_i) and s2 + n s1 + sum((n - i) w_i), i = 0..n-1, exact in 32 bits as HDF5's
// own loop is, so the folds see the same values and the checksum is HDF5's.
namespace {

// sum(w_i) and sum((n - i) w_i) over the n words at p.
void run_sums(const std::uint8_t* p, std::uint32_t n, std::uint32_t& plain,
              std::uint32_t& weighted) {
  plain = weighted = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::uint32_t w = (std::uint32_t(p[2 * i]) << 8) | p[2 * i + 1];
    plain += w;
    weighted += (n - i) * w;
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CUBELM_FLETCHER_AVX2 1
// The same sums, 16 words at a time: per lane k of G groups of 16, S_k = sum of its words
// and T_k = sum over the groups of the running S_k, so that with r = n - 16 G words left
// (summed as above), sum((n - i) w_i) over the groups = 16 sum(T) + r sum(S) - sum(k S_k).
// Unsigned arithmetic wraps, and the result, which fits in 32 bits, is exact.
__attribute__((target("avx2"))) void run_sums_avx2(const std::uint8_t* p, std::uint32_t n,
                                                   std::uint32_t& plain, std::uint32_t& weighted) {
  const std::uint32_t groups = n / 16;
  const __m256i swap = _mm256_setr_epi8(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14, 1, 0,
                                        3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  const __m256i zero = _mm256_setzero_si256();
  __m256i s_lo = zero, s_hi = zero, t_lo = zero, t_hi = zero;
  for (std::uint32_t g = 0; g < groups; ++g) {
    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * g));
    x = _mm256_shuffle_epi8(x, swap); // big-endian words to their values
    s_lo = _mm256_add_epi32(s_lo, _mm256_unpacklo_epi16(x, zero)); // words 0-3, 8-11
    s_hi = _mm256_add_epi32(s_hi, _mm256_unpackhi_epi16(x, zero)); // words 4-7, 12-15
    t_lo = _mm256_add_epi32(t_lo, s_lo);
    t_hi = _mm256_add_epi32(t_hi, s_hi);
  }
  const __m256i k_lo = _mm256_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11);
  const __m256i k_hi = _mm256_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15);
  alignas(32) std::uint32_t s[8], t[8], ks[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(s), _mm256_add_epi32(s_lo, s_hi));
  _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_add_epi32(t_lo, t_hi));
  _mm256_store_si256(
      reinterpret_cast<__m256i*>(ks),
      _mm256_add_epi32(_mm256_mullo_epi32(s_lo, k_lo), _mm256_mullo_epi32(s_hi, k_hi)));
  std::uint32_t sum_s = 0, sum_t = 0, sum_ks = 0;
  for (int k = 0; k < 8; ++k) {
    sum_s += s[k];
    sum_t += t[k];
    sum_ks += ks[k];
  }
  const std::uint32_t r = n - 16 * groups;
  std::uint32_t rest_plain, rest_weighted;
  run_sums(p + 32 * groups, r, rest_plain, rest_weighted);
  plain = sum_s + rest_plain;
  weighted = 16 * sum_t + r * sum_s - sum_ks + rest_weighted;
}
#endif

} // namespace

std::uint32_t fletcher32(const void* data, std::size_t bytes, bool vector) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::size_t words = bytes / 2;
  std::uint32_t sum1 = 0, sum2 = 0;
#ifdef CUBELM_FLETCHER_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  vector = vector && avx2;
#else
  vector = false;
#endif
  while (words > 0) {
    const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::size_t>(words, 360));
    std::uint32_t plain, weighted;
#ifdef CUBELM_FLETCHER_AVX2
    if (vector)
      run_sums_avx2(p, n, plain, weighted);
    else
#endif
      run_sums(p, n, plain, weighted);
    sum2 += n * sum1 + weighted;
    sum1 += plain;
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
    p += 2 * n;
    words -= n;
  }
  sum1 = (sum1 & 0xffff) + (sum1 >> 16);
  sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  return (sum2 << 16) | sum1;
}

} // namespace chunking

namespace {
// HDF5's own bytes, measured on cubelm's checkpoints: the file's superblock, root group
// and attributes, and per dataset its object header and chunk index.
constexpr std::uint64_t kFileMetadata = 16 * 1024;
constexpr std::uint64_t kDatasetMetadata = 4 * 1024;
} // namespace

std::uint64_t checkpoint_file_bytes(const std::vector<std::vector<std::uint64_t>>& shapes) {
  std::uint64_t bytes = kFileMetadata;
  for (const auto& shape : shapes) {
    const std::vector<hsize_t> dims(shape.begin(), shape.end());
    const auto chunk = chunking::chunk_of(dims);
    std::uint64_t chunks = 1, per_chunk = 1;
    for (std::size_t d = 0; d < dims.size(); ++d) {
      chunks *= (dims[d] + chunk[d] - 1) / chunk[d];
      per_chunk *= chunk[d];
    }
    // Every chunk is stored whole (the last one padded), with its 4-byte Fletcher32.
    bytes += chunks * (4 * per_chunk + 4) + kDatasetMetadata;
  }
  return bytes;
}

} // namespace cubelm::io
