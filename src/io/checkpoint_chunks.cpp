// Chunk shapes and the size of a checkpoint file (CheckpointWriter stores tensors so).

#include "checkpoint_chunks.hpp"

#include "cubelm/io/checkpoint.hpp"

#include <algorithm>

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
std::uint32_t fletcher32(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  std::size_t words = bytes / 2;
  std::uint32_t sum1 = 0, sum2 = 0;
  while (words > 0) {
    const std::uint32_t n = static_cast<std::uint32_t>(std::min<std::size_t>(words, 360));
    std::uint32_t plain = 0, weighted = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint32_t w = (std::uint32_t(p[2 * i]) << 8) | p[2 * i + 1];
      plain += w;
      weighted += (n - i) * w;
    }
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
