#pragma once
// How CheckpointWriter chunks a tensor, and so how large a checkpoint file is; HDF5's
// error printing switched off where cubelm reports the failure itself.
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
/// filter stores after a chunk (little-endian), for chunks written directly. With AVX2 16
/// words at a time where the processor has it, unless `vector` is false (the same value).
std::uint32_t fletcher32(const void* data, std::size_t bytes, bool vector = true);

} // namespace cubelm::io::chunking

namespace cubelm::io {

/// Switches off HDF5's printing of its error stack while cubelm probes for things that may
/// be missing (a missing dataset is our message to give, not a trace) or reports a failure
/// itself.
class QuietHdf5 {
public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietHdf5(const QuietHdf5&) = delete;
  QuietHdf5& operator=(const QuietHdf5&) = delete;

private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

} // namespace cubelm::io
