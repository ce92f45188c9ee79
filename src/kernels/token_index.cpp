// The index the embedding backward reads: the rows of each token, in row order, built
// on the device by a stable radix sort of the rows by token, so that no step waits for
// the host. Each pass sorts by one 8-bit digit of the token: every block of rows counts
// its digits, one scan turns the counts into where each (digit, block) starts, and
// every block places its rows in order. The order of rows with the same token is the
// row order, whatever the device and the number of threads.

#include "cubelm/kernels/embedding.hpp"

#include "cubelm/core/error.hpp"

#include "ranges.hpp"

#include <string>
#include <vector>

namespace cubelm::kernels {

namespace {

constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;
// Rows one work item counts and places, in order.
constexpr std::int64_t kSortBlock = 256;

using IntView = Kokkos::View<int*, MemSpace>;

IntView grown(const IntView& v, std::int64_t n, const char* label) {
  if (v.extent_int(0) >= n)
    return v;
  return IntView(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
}

} // namespace

TokenIndex make_token_index(const std::vector<std::int32_t>& tokens, int vocab) {
  for (const std::int32_t t : tokens)
    CUBELM_ASSERT(t >= 0 && t < vocab, "token " + std::to_string(t) + " outside the vocabulary");
  return make_token_index(tokens, 0, vocab);
}

TokenIndex make_token_index(const std::vector<std::int32_t>& tokens, int first, int count) {
  const Tokens ids(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("cubelm::tokens")),
                   tokens.size());
  const Kokkos::View<const std::int32_t*, Kokkos::HostSpace,
                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      host(tokens.data(), tokens.size());
  Kokkos::deep_copy(ids, host);
  TokenIndexer indexer;
  const TokenIndex index = indexer.build(ExecSpace(), ids, first, count);
  ExecSpace().fence();
  return index;
}

const TokenIndex& TokenIndexer::build(const ExecSpace& exec, const Tokens& tokens, int first,
                                      int count) {
  CUBELM_ASSERT(count >= 0, "token index of a negative vocabulary slice");
  const std::int64_t n = tokens.extent(0);
  const std::int64_t blocks = (n + kSortBlock - 1) / kSortBlock;
  // Buffers kept between builds: allocated on the first build of a shape only.
  if (index_.offsets.extent_int(0) != count + 1)
    index_.offsets = IntView("cubelm::token_offsets", count + 1);
  keys_ = grown(keys_, n, "cubelm::token_keys");
  order_[0] = grown(order_[0], n, "cubelm::token_positions");
  order_[1] = grown(order_[1], n, "cubelm::token_positions");
  counts_ = grown(counts_, kDigits * blocks, "cubelm::token_digit_counts");
  starts_ = grown(starts_, kDigits * blocks, "cubelm::token_digit_starts");

  // Key of row i: its token's entry in the slice; rows of other tokens get `count`,
  // which sorts after every entry.
  const IntView keys = keys_, counts = counts_, starts = starts_;
  IntView src = order_[0], dst = order_[1];
  {
    const IntView order = src;
    Kokkos::parallel_for(
        "cubelm::token_keys", Range(exec, 0, n), KOKKOS_LAMBDA(const std::int64_t i) {
          const std::int64_t t = static_cast<std::int64_t>(tokens(i)) - first;
          keys(i) = t >= 0 && t < count ? static_cast<int>(t) : count;
          order(i) = static_cast<int>(i);
        });
  }
  int passes = 1;
  while (passes * kDigitBits < 31 && (count >> (passes * kDigitBits)) > 0)
    ++passes;
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pass * kDigitBits;
    const IntView from = src, to = dst;
    Kokkos::parallel_for(
        "cubelm::token_digit_counts", Range(exec, 0, blocks), KOKKOS_LAMBDA(const std::int64_t b) {
          for (int d = 0; d < kDigits; ++d)
            counts(d * blocks + b) = 0;
          const std::int64_t end = (b + 1) * kSortBlock < n ? (b + 1) * kSortBlock : n;
          for (std::int64_t i = b * kSortBlock; i < end; ++i)
            counts(((keys(from(i)) >> shift) & (kDigits - 1)) * blocks + b) += 1;
        });
    Kokkos::parallel_scan(
        "cubelm::token_digit_starts", Range(exec, 0, kDigits * blocks),
        KOKKOS_LAMBDA(const std::int64_t j, int& before, const bool final) {
          if (final)
            starts(j) = before;
          before += counts(j);
        });
    Kokkos::parallel_for(
        "cubelm::token_digit_place", Range(exec, 0, blocks), KOKKOS_LAMBDA(const std::int64_t b) {
          const std::int64_t end = (b + 1) * kSortBlock < n ? (b + 1) * kSortBlock : n;
          for (std::int64_t i = b * kSortBlock; i < end; ++i) {
            const int row = from(i);
            to(starts(((keys(row) >> shift) & (kDigits - 1)) * blocks + b)++) = row;
          }
        });
    const IntView t = src;
    src = dst;
    dst = t;
  }
  // offsets[v] = the first sorted row whose key is at least v: row i sets the entries
  // between the key before it and its own.
  const IntView offsets = index_.offsets, sorted = src;
  Kokkos::parallel_for(
      "cubelm::token_offsets", Range(exec, 0, n + 1), KOKKOS_LAMBDA(const std::int64_t i) {
        const int lo = i == 0 ? 0 : keys(sorted(i - 1)) + 1;
        const int hi = i == n ? count : keys(sorted(i));
        for (int v = lo; v <= hi; ++v)
          offsets(v) = static_cast<int>(i);
      });
  index_.positions = sorted;
  return index_;
}

} // namespace cubelm::kernels
