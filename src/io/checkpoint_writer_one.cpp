// The one writer (Writers::one, or a single rank): the first rank assembles each tensor in
// slabs from the blocks every rank sends it and writes HDF5's checksummed chunks itself,
// through the direct driver (checkpoint_direct.hpp).

#include "cubelm/io/checkpoint.hpp"

#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/mpi_wait.hpp"

#include "checkpoint_chunks.hpp"
#include "checkpoint_direct.hpp"

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
// kSlabElements (16 MiB of float32) unless one chunk is larger, taken from a ring that it
// lends the driver (direct::Slabs): slabs are written while the next arrive. A tensor's
// first slab is one chunk, and each next one twice the one before up to that size
// (slab_starts), so that the driver has a chunk to write soon after the tensor's blocks
// begin to arrive rather than after a whole slab of them. (With slabs of 64 MiB, the
// driver waited 10-80 ms for the first slab of GPT-2's embedding at the start of a save,
// and again whenever the writer took longer to assemble a slab than the driver to write
// the one before.)
constexpr std::uint64_t kSlabElements = std::uint64_t(1) << 22;
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

// The elements of a slab buffer for `rows` rows of a tensor of `dims`: whole chunks (the
// last chunk of a tensor is padded), and one more for the checksum after the last.
std::uint64_t slab_elements_held(const std::vector<hsize_t>& dims, std::uint64_t rows) {
  const std::uint64_t chunk_rows = chunking::chunk_of(dims)[0];
  return (rows + chunk_rows - 1) / chunk_rows * chunk_rows * row_elements(dims) + 1;
}

// The first row of each slab of a tensor of `dims`, and dims[0] after the last: one chunk
// row, then twice as many rows as the slab before, up to slab_rows(dims).
std::vector<std::uint64_t> slab_starts(const std::vector<hsize_t>& dims) {
  std::vector<std::uint64_t> starts{0};
  if (dims.empty() || dims[0] == 0)
    return starts;
  const std::uint64_t most = slab_rows(dims);
  for (std::uint64_t rows = std::min<std::uint64_t>(chunking::chunk_of(dims)[0], most);
       starts.back() < dims[0]; rows = std::min(2 * rows, most))
    starts.push_back(std::min<std::uint64_t>(dims[0], starts.back() + rows));
  return starts;
}

} // namespace

std::uint64_t writer_buffer_bytes(const std::vector<std::vector<std::uint64_t>>& shapes,
                                  Writers writers, int ranks) {
  if (writers != Writers::one && ranks > 1)
    return 0;
  std::uint64_t slab = 0, staging[2] = {0, 0}, chunk = 0;
  for (const auto& shape : shapes) {
    const auto dims = to_hsize(shape);
    if (dims.empty() || dims[0] == 0)
      continue;
    // The ring holds kCount of the largest slab (direct::Slabs); the blocks of columns of
    // other ranks arrive in two staging buffers, slab k's in buffer k % 2, each grown to
    // the largest slab it took.
    const auto starts = slab_starts(dims);
    for (std::size_t k = 0; k + 1 < starts.size(); ++k) {
      const std::uint64_t held =
          slab_elements_held(dims, starts[k + 1] - starts[k]) * sizeof(float);
      slab = std::max(slab, direct::whole_blocks(held));
      if (ranks > 1)
        staging[k % 2] = std::max(staging[k % 2], held);
    }
    // A chunk as write_chunks hands it to the driver: its elements and the checksum.
    chunk =
        std::max<std::uint64_t>(chunk, chunking::chunk_of(dims)[0] * row_elements(dims) * 4 + 4);
  }
  return direct::Slabs::kCount * slab + staging[0] + staging[1] + direct::buffer_bytes(chunk);
}

namespace {

// Rows [first, end) of a tensor of `dims`, whole chunks from `slab` (row `first` at its
// start), written as HDF5 stores them: each chunk's bytes (the last chunk of the tensor
// padded with zeros) followed by its Fletcher32 checksum, so HDF5 neither filters nor
// copies them. The checksum goes where the next chunk's first element is (or the slab's
// spare element after the last), which is put back after the write.
// Returns why a chunk could not be written (HDF5's innermost message: the driver's, which
// names the file and the system's error), or "".
// The slab is lent to the driver (direct::Slabs): a chunk's bytes stay as they are once
// handed over, but for its last block.
std::string write_chunks(hid_t dset, const std::vector<hsize_t>& dims, std::uint64_t first,
                         std::uint64_t end, float* slab, std::uint64_t held) {
  const std::uint64_t chunk_rows = chunking::chunk_of(dims)[0];
  const std::uint64_t chunk = chunk_rows * row_elements(dims); // elements
  const std::uint64_t chunks = (end - first + chunk_rows - 1) / chunk_rows;
  const std::uint64_t filled = (end - first) * row_elements(dims);
  CUBELM_ASSERT(held >= chunks * chunk + 1, "checkpoint slab buffer too small");
  std::fill(slab + filled, slab + chunks * chunk, 0.0f);
  std::vector<hsize_t> offset(dims.size(), 0);
  for (std::uint64_t c = 0; c < chunks; ++c) {
    float* const at = slab + c * chunk;
    const std::size_t bytes = static_cast<std::size_t>(chunk) * sizeof(float);
    const std::uint32_t sum = chunking::fletcher32(at, bytes);
    unsigned char stored[4] = {
        static_cast<unsigned char>(sum), static_cast<unsigned char>(sum >> 8),
        static_cast<unsigned char>(sum >> 16), static_cast<unsigned char>(sum >> 24)};
    float next;
    std::memcpy(&next, at + chunk, sizeof next);
    std::memcpy(at + chunk, stored, sizeof stored);
    offset[0] = first + c * chunk_rows;
    herr_t written;
    {
      QuietHdf5 quiet; // a failure is reported by the caller
      written = H5Dwrite_chunk(dset, H5P_DEFAULT, 0, offset.data(), bytes + 4, at);
    }
    std::memcpy(at + chunk, &next, sizeof next);
    if (written < 0)
      return cubelm::detail::hdf5_error_message();
  }
  return "";
}

} // namespace

// The one writer: every rank sends the first rank its elements (its block, or a run of it)
// that fall in each slab of the tensor, in slab order; the first rank receives them in
// place (from a block of whole rows, whose elements are contiguous in the tensor) or staged
// and placed into their columns, hands slab k's chunks to the driver and posts the receives
// of slab k + 1, and so writes each chunk whole, once.
void CheckpointWriter::write_gathered(std::int64_t dset, const std::vector<std::uint64_t>& shape,
                                      std::uint64_t first, std::uint64_t count, const float* data,
                                      const std::vector<std::uint64_t>& blocks) {
  const auto dims = to_hsize(shape);
  const int nd = static_cast<int>(dims.size());
  const std::size_t stride = 2 * static_cast<std::size_t>(nd) + 3; // as write() gathered them
  const int ranks = comm_.size();
  const bool writer = comm_.rank() == 0;
  const std::vector<std::uint64_t> starts = slab_starts(dims); // slab k: rows [k], [k + 1]
  const std::uint64_t slabs = starts.size() - 1;
  // The elements of slab k's buffer, and of the largest.
  const auto held = [&](std::uint64_t k) {
    return slab_elements_held(dims, starts[k + 1] - starts[k]);
  };
  std::uint64_t largest = 0;
  for (std::uint64_t k = 0; k < slabs; ++k)
    largest = std::max(largest, held(k));
  const auto int_count = [&](std::uint64_t n) {
    CUBELM_ASSERT(n <= static_cast<std::uint64_t>(std::numeric_limits<int>::max()),
                  "checkpoint " + path_ + ": a slab holds more elements than an MPI count");
    return static_cast<int>(n);
  };
  // The elements [s, e) of block b (offsets, counts, first, count) that fall in slab k,
  // numbered in the block's row-major order.
  const auto in_slab = [&](const std::uint64_t* b, std::uint64_t k) {
    std::uint64_t row = 1; // elements of one row of the block
    for (int d = 1; d < nd; ++d)
      row *= b[nd + d];
    const std::uint64_t lo = std::max(b[0], starts[k]);
    const std::uint64_t hi = std::min(b[0] + b[nd], starts[k + 1]);
    const std::uint64_t from = b[2 * nd], to = b[2 * nd] + b[2 * nd + 1];
    const std::uint64_t s = std::max(from, lo < hi ? (lo - b[0]) * row : to);
    const std::uint64_t e = std::min(to, lo < hi ? (hi - b[0]) * row : to);
    return std::make_pair(s, std::max(s, e));
  };
  // The other ranks send the writer their elements of each slab, contiguous as they hold
  // them, all at once (MPI matches them to the writer's receives in order), and wait for
  // the sends asleep: they need not wake between slabs for the writer to go on.
  if (!writer) {
    const std::uint64_t* mine = blocks.data() + static_cast<std::size_t>(comm_.rank()) * stride;
    std::vector<MPI_Request> sent;
    for (std::uint64_t k = 0; k < slabs && count > 0; ++k) {
      const auto [s, e] = in_slab(mine, k);
      if (s == e)
        continue;
      float* const part = const_cast<float*>(data) + (s - first); // MPI-2 API
      sent.emplace_back();
      CUBELM_MPI_CHECK(
          MPI_Isend(part, int_count(e - s), MPI_FLOAT, 0, kGatherTag, comm_.raw(), &sent.back()));
    }
    wait_all(sent, true);
    return;
  }

  // A block of whole rows arrives in place; a block of columns arrives whole in the
  // staging buffer (a contiguous receive, which MPI copies without the sender's help) and
  // is placed into its columns after.
  const auto whole_rows = [&](const std::uint64_t* b) {
    for (int d = 1; d < nd; ++d)
      if (b[d] != 0 || b[nd + d] != dims[d])
        return false;
    return true;
  };
  bool columns = false;
  for (int q = 0; q < ranks; ++q)
    columns = columns || !whole_rows(blocks.data() + static_cast<std::size_t>(q) * stride);
  float* slab_of[2] = {nullptr, nullptr}; // slab k's memory is slab_of[k % 2]
  struct Staged {
    std::uint64_t at;       // in the staging buffer
    const std::uint64_t* b; // the block
    std::uint64_t s, e;     // its elements in the slab
  };
  // Elements [s, e) of block b, packed at `from`, into their place in the slab whose
  // first row is `first_row`: one copy per run of the last dimension.
  const auto place = [&](const float* from, const std::uint64_t* b, std::uint64_t s,
                         std::uint64_t e, std::uint64_t first_row, float* slab) {
    const std::uint64_t run = b[2 * nd - 1];
    std::vector<std::uint64_t> at(static_cast<std::size_t>(nd)); // within the block
    for (std::uint64_t j = s; j < e;) {
      std::uint64_t rest = j;
      for (int d = nd - 1; d >= 0; --d) {
        at[static_cast<std::size_t>(d)] = rest % b[nd + d];
        rest /= b[nd + d];
      }
      std::uint64_t into = b[0] + at[0] - first_row;
      for (int d = 1; d < nd; ++d)
        into = into * dims[d] + b[d] + at[static_cast<std::size_t>(d)];
      const std::uint64_t n = std::min(e - j, run - at[static_cast<std::size_t>(nd - 1)]);
      std::memcpy(slab + into, from, n * sizeof(float));
      from += n;
      j += n;
    }
  };
  // Where element j of a block of whole rows goes in the slab whose first row is first_row.
  const auto in_place = [&](const std::uint64_t* b, std::uint64_t j, std::uint64_t first_row) {
    return b[0] * row_elements(dims) + j - first_row * row_elements(dims);
  };
  std::vector<MPI_Request> requests[2];
  std::vector<Staged> staged[2];
  // Posts the receives of slab k into its buffers and copies the writer's own rows, once
  // the driver has written what the ring held there before.
  const auto post = [&](std::uint64_t k) {
    float* const slab = slab_of[k % 2] = slabs_->next(held(k), largest);
    if (columns && staging_[k % 2].size() < held(k))
      staging_[k % 2].resize(held(k));
    auto& pending = requests[k % 2];
    std::uint64_t at = 0;
    for (int q = 0; q < ranks; ++q) {
      const std::uint64_t* b = blocks.data() + static_cast<std::size_t>(q) * stride;
      if (b[2 * nd + 1] == 0)
        continue;
      const auto [s, e] = in_slab(b, k);
      if (s == e)
        continue;
      if (q == comm_.rank()) { // the writer's own elements: copied, not sent
        const float* from = data + (s - first);
        if (whole_rows(b))
          std::memcpy(slab + in_place(b, s, starts[k]), from, (e - s) * sizeof(float));
        else
          place(from, b, s, e, starts[k], slab);
        continue;
      }
      float* into;
      if (whole_rows(b)) {
        into = slab + in_place(b, s, starts[k]);
      } else {
        staged[k % 2].push_back({at, b, s, e});
        into = staging_[k % 2].data() + at;
        at += e - s;
      }
      pending.emplace_back();
      CUBELM_MPI_CHECK(MPI_Irecv(into, int_count(e - s), MPI_FLOAT, q, kGatherTag, comm_.raw(),
                                 &pending.back()));
    }
  };
  // Slab k + 1 is posted once slab k is handed to the driver, whose thread writes it (and
  // what the ring holds before it) while slab k + 1 arrives. The receives need not be
  // posted earlier: MPI copies a large message when the writer waits for it.
  if (slabs > 0)
    post(0);
  for (std::uint64_t k = 0; k < slabs; ++k) {
    auto& pending = requests[k % 2];
    wait_all(pending);
    pending.clear();
    for (const Staged& piece : staged[k % 2])
      place(staging_[k % 2].data() + piece.at, piece.b, piece.s, piece.e, starts[k],
            slab_of[k % 2]);
    staged[k % 2].clear();
    // After a failure the slabs still arrive (the senders do not know yet) but go nowhere.
    if (!failure_->failed())
      if (const std::string problem =
              write_chunks(dset, dims, starts[k], starts[k + 1], slab_of[k % 2], held(k));
          !problem.empty())
        failure_->record(problem);
    // Start writing the slab's pages in the page cache to storage now, while the next slab
    // arrives: the sync at close() then waits for the last ones only. The driver writes
    // the chunks' whole blocks directly; where the file system refuses O_DIRECT, this is
    // what keeps the device busy.
    if (sync_fd_ >= 0)
      ::sync_file_range(sync_fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
    if (k + 1 < slabs)
      post(k + 1);
  }
}

} // namespace cubelm::io
