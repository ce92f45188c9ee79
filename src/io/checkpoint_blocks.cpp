// A Block's geometry: whole tensors, rows, sizes, and runs of a block's elements as
// blocks (the parts of a block that ranks write in flat pieces); shapes as messages print
// them.

#include "cubelm/core/error.hpp"
#include "cubelm/io/checkpoint.hpp"

#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace cubelm::io {

Block Block::whole(const std::vector<std::uint64_t>& shape) {
  return {std::vector<std::uint64_t>(shape.size(), 0), shape};
}

Block Block::rows(const std::vector<std::uint64_t>& shape, std::uint64_t begin, std::uint64_t end) {
  Block b = whole(shape);
  CUBELM_ASSERT(!shape.empty() && begin <= end, "Block::rows needs a shape and begin <= end");
  b.offset[0] = begin;
  b.count[0] = end - begin;
  return b;
}

std::uint64_t Block::size() const {
  return count.empty()
             ? 0
             : std::accumulate(count.begin(), count.end(), std::uint64_t{1}, std::multiplies<>());
}

namespace {

// Elements [first, end) of the block at `offset` with `count`, whose dimensions before d
// are one element (a slice of it), appended to `out` as blocks in row-major order:
// a partial slice along d, the whole slices, a partial slice.
void run_blocks(std::vector<std::uint64_t>& offset, std::vector<std::uint64_t>& count,
                std::size_t d, std::uint64_t first, std::uint64_t end, std::vector<Block>& out) {
  if (first >= end)
    return;
  std::uint64_t inner = 1; // elements of one slice along d
  for (std::size_t e = d + 1; e < count.size(); ++e)
    inner *= count[e];
  const std::uint64_t at = offset[d], n = count[d];
  const auto slice = [&](std::uint64_t i, std::uint64_t lo, std::uint64_t hi) {
    offset[d] = at + i;
    count[d] = 1;
    run_blocks(offset, count, d + 1, lo, hi, out);
    offset[d] = at;
    count[d] = n;
  };
  std::uint64_t whole = first / inner;
  if (first % inner != 0) {
    const std::uint64_t stop = std::min(end, (whole + 1) * inner);
    slice(whole, first - whole * inner, stop - whole * inner);
    if (stop == end)
      return;
    ++whole;
  }
  if (end / inner > whole) {
    Block b{offset, count};
    b.offset[d] = at + whole;
    b.count[d] = end / inner - whole;
    out.push_back(std::move(b));
  }
  if (end % inner != 0)
    slice(end / inner, 0, end % inner);
}

} // namespace

std::vector<Block> Block::run(std::uint64_t first, std::uint64_t count) const {
  CUBELM_ASSERT(first + count <= size() || count == 0, "Block::run past the end of the block");
  std::vector<Block> out;
  if (count == 0)
    return out;
  std::vector<std::uint64_t> at = offset, extent = this->count;
  run_blocks(at, extent, 0, first, first + count, out);
  return out;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

} // namespace cubelm::io
