// The one writer (Writers::one, or a single rank): the first rank assembles each tensor in
// slabs from the blocks every rank sends it and writes HDF5's checksummed chunks itself.

#include "cubelm/io/checkpoint.hpp"

#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/mpi_wait.hpp"

#include "checkpoint_chunks.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace cubelm::io {

using chunking::to_hsize;

namespace {

// The one writer assembles each tensor in slabs of whole chunk rows, at most
// kSlabElements (64 MiB of float32) unless one chunk is larger, and posts the receives of
// the next slab before it writes one.
constexpr std::uint64_t kSlabElements = std::uint64_t(1) << 24;
constexpr int kGatherTag = 7411;

std::uint64_t row_elements(const std::vector<hsize_t>& dims) {
  std::uint64_t row = 1;
  for (std::size_t d = 1; d < dims.size(); ++d)
    row *= dims[d];
  return row;
}

// Test hook: CUBELM_TEST_SLAB_ELEMENTS=<n> makes slabs of at most n elements (at least one
// chunk row), so that small tensors take several slabs.
std::uint64_t slab_elements() {
  const char* value = std::getenv("CUBELM_TEST_SLAB_ELEMENTS");
  return value ? std::max<std::uint64_t>(1, std::strtoull(value, nullptr, 10)) : kSlabElements;
}

// The rows of one slab of a tensor of `dims` (at least 1).
std::uint64_t slab_rows(const std::vector<hsize_t>& dims) {
  if (dims.empty() || dims[0] == 0)
    return 1;
  const std::uint64_t chunk_rows = chunking::chunk_of(dims)[0];
  const std::uint64_t chunk = chunk_rows * std::max<std::uint64_t>(row_elements(dims), 1);
  const std::uint64_t chunks = std::max<std::uint64_t>(1, slab_elements() / chunk);
  return std::min<std::uint64_t>(dims[0], chunks * chunk_rows);
}

// The elements of one slab buffer: whole chunks (the last chunk of a tensor is padded),
// and one more for the checksum after the last.
std::uint64_t slab_elements_held(const std::vector<hsize_t>& dims) {
  const std::uint64_t chunk_rows = chunking::chunk_of(dims)[0];
  const std::uint64_t rows = (slab_rows(dims) + chunk_rows - 1) / chunk_rows * chunk_rows;
  return rows * row_elements(dims) + 1;
}

} // namespace

std::uint64_t writer_buffer_bytes(const std::vector<std::vector<std::uint64_t>>& shapes,
                                  Writers writers, int ranks) {
  if (writers != Writers::one && ranks > 1)
    return 0;
  std::uint64_t most = 0;
  for (const auto& shape : shapes) {
    const auto dims = to_hsize(shape);
    if (dims.empty() || dims[0] == 0)
      continue;
    const std::uint64_t rows = slab_rows(dims);
    const std::uint64_t buffers = rows < dims[0] ? 2 : 1;
    most = std::max(most, buffers * slab_elements_held(dims) * sizeof(float));
  }
  return most;
}

namespace {

// Rows [first, end) of a tensor of `dims`, whole chunks from `slab` (row `first` at its
// start), written as HDF5 stores them: each chunk's bytes (the last chunk of the tensor
// padded with zeros) followed by its Fletcher32 checksum, so HDF5 neither filters nor
// copies them. The checksum goes where the next chunk's first element is (or the slab's
// spare element after the last), which is put back after the write.
void write_chunks(hid_t dset, const std::vector<hsize_t>& dims, std::uint64_t first,
                  std::uint64_t end, std::vector<float>& slab) {
  const std::uint64_t chunk_rows = chunking::chunk_of(dims)[0];
  const std::uint64_t chunk = chunk_rows * row_elements(dims); // elements
  const std::uint64_t chunks = (end - first + chunk_rows - 1) / chunk_rows;
  const std::uint64_t filled = (end - first) * row_elements(dims);
  CUBELM_ASSERT(slab.size() >= chunks * chunk + 1, "checkpoint slab buffer too small");
  std::fill(slab.begin() + static_cast<std::ptrdiff_t>(filled),
            slab.begin() + static_cast<std::ptrdiff_t>(chunks * chunk), 0.0f);
  std::vector<hsize_t> offset(dims.size(), 0);
  for (std::uint64_t c = 0; c < chunks; ++c) {
    float* const at = slab.data() + c * chunk;
    const std::size_t bytes = static_cast<std::size_t>(chunk) * sizeof(float);
    const std::uint32_t sum = chunking::fletcher32(at, bytes);
    unsigned char stored[4] = {
        static_cast<unsigned char>(sum), static_cast<unsigned char>(sum >> 8),
        static_cast<unsigned char>(sum >> 16), static_cast<unsigned char>(sum >> 24)};
    float next;
    std::memcpy(&next, at + chunk, sizeof next);
    std::memcpy(at + chunk, stored, sizeof stored);
    offset[0] = first + c * chunk_rows;
    const herr_t written = H5Dwrite_chunk(dset, H5P_DEFAULT, 0, offset.data(), bytes + 4, at);
    std::memcpy(at + chunk, &next, sizeof next);
    CUBELM_HDF5_CHECK(written);
  }
}

} // namespace

// The one writer: every rank sends the first rank the rows of its block that fall in each
// slab of the tensor, in slab order; the first rank places them with an MPI subarray type
// (so a block of columns lands in its columns), posts the receives of slab k + 1 before it
// writes slab k, and so writes each chunk whole, once.
void CheckpointWriter::write_gathered(std::int64_t dset, const std::vector<std::uint64_t>& shape,
                                      const Block& block, const float* data,
                                      const std::vector<std::uint64_t>& blocks) {
  const auto dims = to_hsize(shape);
  const int nd = static_cast<int>(dims.size());
  const std::size_t stride = 2 * static_cast<std::size_t>(nd) + 1; // as write() gathered them
  const int ranks = comm_.size();
  for (const hsize_t d : dims)
    CUBELM_ASSERT(d <= static_cast<hsize_t>(std::numeric_limits<int>::max()),
                  "checkpoint " + path_ + ": a dimension of " + shape_text(shape) +
                      " exceeds what an MPI datatype can describe");
  const bool writer = comm_.rank() == 0;
  const std::uint64_t rows = slab_rows(dims);
  const std::uint64_t slabs = dims[0] == 0 ? 0 : (dims[0] + rows - 1) / rows;
  // Rows [lo, hi) of a block at row `offset` with `count` rows that fall in slab k.
  const auto overlap = [&](std::uint64_t offset, std::uint64_t count, std::uint64_t k) {
    const std::uint64_t lo = std::max(offset, k * rows);
    const std::uint64_t hi =
        std::min(offset + count, std::min<std::uint64_t>(dims[0], (k + 1) * rows));
    return std::make_pair(lo, std::max(lo, hi));
  };
  const auto int_count = [&](std::uint64_t n) {
    CUBELM_ASSERT(n <= static_cast<std::uint64_t>(std::numeric_limits<int>::max()),
                  "checkpoint " + path_ + ": a slab holds more elements than an MPI count");
    return static_cast<int>(n);
  };
  std::uint64_t block_row = 1; // elements of one row of this rank's block
  for (int d = 1; d < nd && !block.empty(); ++d)
    block_row *= block.count[d];
  // This rank's rows of slab k, to the writer: from the other ranks a send they wait for
  // asleep, from the writer itself a request completed with the slab's receives.
  const auto send = [&](std::uint64_t k, std::vector<MPI_Request>* pending) {
    if (block.empty())
      return;
    const auto [lo, hi] = overlap(block.offset[0], block.count[0], k);
    if (lo == hi)
      return;
    float* const rows_of =
        const_cast<float*>(data) + (lo - block.offset[0]) * block_row; // MPI-2 API
    const int n = int_count((hi - lo) * block_row);
    if (pending == nullptr) { // the writer receives it when it gets to the slab
      std::vector<MPI_Request> sent(1);
      CUBELM_MPI_CHECK(MPI_Isend(rows_of, n, MPI_FLOAT, 0, kGatherTag, comm_.raw(), sent.data()));
      wait_all(sent, true);
    } else {
      pending->emplace_back();
      CUBELM_MPI_CHECK(
          MPI_Isend(rows_of, n, MPI_FLOAT, 0, kGatherTag, comm_.raw(), &pending->back()));
    }
  };
  if (!writer) {
    for (std::uint64_t k = 0; k < slabs; ++k)
      send(k, nullptr);
    return;
  }

  const std::uint64_t held = slab_elements_held(dims);
  for (auto& buffer : slabs_)
    if (buffer.size() < held && (&buffer == &slabs_[0] || slabs > 1))
      buffer.resize(held);
  std::vector<MPI_Request> requests[2];
  // Posts the receives of slab k into its buffer, then sends this rank's own rows.
  const auto post = [&](std::uint64_t k) {
    auto& pending = requests[k % 2];
    const std::uint64_t first = k * rows;
    const std::uint64_t count = std::min<std::uint64_t>(dims[0], first + rows) - first;
    for (int q = 0; q < ranks; ++q) {
      const std::uint64_t* b = blocks.data() + static_cast<std::size_t>(q) * stride;
      bool empty = false;
      for (int d = 0; d < nd; ++d)
        empty = empty || b[nd + d] == 0;
      if (empty)
        continue;
      const auto [lo, hi] = overlap(b[0], b[nd], k);
      if (lo == hi)
        continue;
      std::vector<int> sizes(nd), sub(nd), starts(nd);
      sizes[0] = int_count(count);
      sub[0] = int_count(hi - lo);
      starts[0] = int_count(lo - first);
      for (int d = 1; d < nd; ++d) {
        sizes[d] = static_cast<int>(dims[d]);
        sub[d] = static_cast<int>(b[nd + d]);
        starts[d] = static_cast<int>(b[d]);
      }
      MPI_Datatype type;
      CUBELM_MPI_CHECK(MPI_Type_create_subarray(nd, sizes.data(), sub.data(), starts.data(),
                                                MPI_ORDER_C, MPI_FLOAT, &type));
      CUBELM_MPI_CHECK(MPI_Type_commit(&type));
      pending.emplace_back();
      CUBELM_MPI_CHECK(
          MPI_Irecv(slabs_[k % 2].data(), 1, type, q, kGatherTag, comm_.raw(), &pending.back()));
      CUBELM_MPI_CHECK(MPI_Type_free(&type)); // freed once the receive completes
    }
    send(k, &pending);
  };
  if (slabs > 0)
    post(0);
  for (std::uint64_t k = 0; k < slabs; ++k) {
    if (k + 1 < slabs)
      post(k + 1);
    auto& pending = requests[k % 2];
    wait_all(pending);
    pending.clear();
    write_chunks(dset, dims, k * rows, std::min<std::uint64_t>(dims[0], (k + 1) * rows),
                 slabs_[k % 2]);
    // Start writing the slab's pages to storage now, while the next slab arrives: the sync
    // at close() then waits for the last ones only (one stream of writes to the device
    // otherwise starts when the page cache is full, or at the sync).
    if (sync_fd_ >= 0)
      ::sync_file_range(sync_fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
  }
}

} // namespace cubelm::io
