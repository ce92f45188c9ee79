#pragma once
// How CheckpointWriter chunks a tensor, and so how large a checkpoint file is.
// Internal to src/io.

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cubelm::io::chunking {

/// A shape as HDF5 takes it.
inline std::vector<hsize_t> to_hsize(const std::vector<std::uint64_t>& v) {
  return std::vector<hsize_t>(v.begin(), v.end());
}

/// The chunk shape of a tensor of `dims` (whole rows, at most 2^20 elements, rows spread evenly).
std::vector<hsize_t> chunk_of(const std::vector<hsize_t>& dims);

/// HDF5's Fletcher32 checksum of `bytes` bytes (an even number), bit for bit the value its
/// filter stores after a chunk (little-endian), for chunks written directly.
std::uint32_t fletcher32(const void* data, std::size_t bytes);

} // namespace cubelm::io::chunking
