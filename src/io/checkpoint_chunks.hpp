#pragma once
// How CheckpointWriter chunks a tensor, and so how large a checkpoint file is.
// Internal to src/io.

#include <hdf5.h>

#include <vector>

namespace cubelm::io::chunking {

/// The chunk shape of a tensor of `dims` (whole rows, at most 2^20 elements, rows spread evenly).
std::vector<hsize_t> chunk_of(const std::vector<hsize_t>& dims);

} // namespace cubelm::io::chunking
