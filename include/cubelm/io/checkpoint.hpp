#pragma once
/// \file
/// \brief Layout-independent checkpoints: one parallel HDF5 file, every tensor
/// stored once with its global shape (docs/training.md, Checkpoints).
///
/// The layer knows nothing about models. A caller names each tensor by an HDF5
/// path ("/model/layers/0/attn/wq"), gives its global, logical shape and the
/// block of it this rank owns, and the writer stores it as a row-major float32
/// dataset. Replicas pass an empty block and write nothing. Reading takes any
/// block of any stored tensor, so a checkpoint written by one decomposition
/// (tp=3d:8) loads into another (tp=1d:2, or one rank): resharding on load.
///
/// On disk (a reader outside the project, h5py or h5dump, relies on this):
///  - datasets: H5T_IEEE_F32LE, contiguous, the global shape, row-major;
///  - string attributes: scalar, variable-length, UTF-8 (h5py reads a `str`);
///    variable length so that a deck of any size fits (an object header holds
///    at most 64 KiB of fixed-size attribute data);
///  - int64 attributes: scalar H5T_STD_I64LE; double: scalar H5T_IEEE_F64LE;
///  - the root attribute format = "cubelm-checkpoint", written by the writer
///    itself; the reader refuses a file without it;
///  - the file is written as "<path>.partial" and renamed to <path> only when
///    complete, so a crash never leaves a truncated file under the final name
///    and never destroys the previous checkpoint of that name.
///
/// Collective means: every rank of the communicator calls it, in the same
/// order, with the same arguments (except each rank's own block and data).
/// Errors found while doing so are agreed between the ranks before anything
/// collective happens, so every rank throws the same exception and no rank is
/// left waiting: cubelm::Error (marked collective) for what a user can cause
/// (a missing, foreign or mismatched checkpoint), cubelm::InternalError for
/// misuse by the calling code (blocks that do not tile the tensor).

#include "cubelm/comm/communicator.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace cubelm::io {

namespace direct {
class Failure; // the one writer's file driver (src/io/checkpoint_direct.hpp)
class Slabs;
} // namespace direct

/// \brief The value of the root attribute "format" of every cubelm checkpoint.
inline constexpr const char* checkpoint_format = "cubelm-checkpoint";

/// \brief A rectangular part of a global tensor: element (offset + i) for i < count.
///
/// Empty vectors, or any zero count, mean "no elements": the rank takes part
/// in the collective call but transfers nothing (a replica on write).
struct Block {
  std::vector<std::uint64_t> offset;
  std::vector<std::uint64_t> count;

  /// \brief The whole tensor of `shape`.
  static Block whole(const std::vector<std::uint64_t>& shape);
  /// \brief No elements.
  static Block none() { return {}; }
  /// \brief Rows [begin, end) of a tensor of `shape` (all of its other dimensions).
  static Block rows(const std::vector<std::uint64_t>& shape, std::uint64_t begin,
                    std::uint64_t end);

  /// \brief The number of elements (0 for an empty block).
  std::uint64_t size() const;
  bool empty() const { return size() == 0; }

  /// \brief Elements [first, first + count) of this block in its row-major order, as
  /// blocks in that order (at most 2 d - 1 of them for d dimensions): a part of the block
  /// cut from its flat layout, a ZeRO shard of a parameter's block for one.
  std::vector<Block> run(std::uint64_t first, std::uint64_t count) const;
};

/// \brief "[256, 64]": a shape as messages print it.
std::string shape_text(const std::vector<std::uint64_t>& shape);

/// \brief Throws a collective cubelm::Error unless `stored` equals `expected`.
///
/// The message names the file, the dataset and both shapes:
/// "checkpoint x.h5: /model/wte has shape [256, 64], the deck needs [512, 64]".
void check_shape(const std::string& file, const std::string& dataset,
                 const std::vector<std::uint64_t>& stored,
                 const std::vector<std::uint64_t>& expected);

/// \brief Which ranks write a checkpoint file (deck key checkpoint.writers).
enum class Writers {
  /// every rank writes its own blocks, through MPI-IO (parallel HDF5, collective transfers)
  all,
  /// the first rank writes the whole file through HDF5's POSIX driver; the other ranks send
  /// it their blocks, a slab of whole chunk rows at a time
  one,
};

/// \brief The Writers a deck's checkpoint.writers names ("all" or "one", as the deck checks).
inline Writers writers_named(const std::string& value) {
  return value == "one" ? Writers::one : Writers::all;
}

/// \brief The host memory the first rank holds while it writes tensors of `shapes` under
/// Writers::one or alone: two slabs of the largest tensor, at most 64 MiB each unless one
/// chunk is larger, on more than one rank as much again to receive blocks of columns into,
/// and the file driver's three buffers of the largest chunk (0 for Writers::all on more
/// than one rank).
std::uint64_t writer_buffer_bytes(const std::vector<std::vector<std::uint64_t>>& shapes,
                                  Writers writers, int ranks);

/// \brief Writes one checkpoint file collectively: through parallel HDF5 over MPI-IO, or
/// through the first rank alone (Writers::one, and always on a single rank), which writes
/// HDF5's checksummed chunks itself, their whole blocks with O_DIRECT where the file system
/// allows it. The file is the same.
///
/// A writer that is destroyed without close() (an exception on every rank)
/// closes its HDF5 handles and leaves "<path>.partial" behind; the final name
/// is untouched. The destructor is collective too: if only some ranks unwind,
/// the job is broken anyway and the caller should abort it.
class CheckpointWriter {
public:
  /// \brief Collective: creates (or truncates) partial_path(path) on every rank of `comm`.
  ///
  /// A directory that does not exist or cannot be written is a collective
  /// cubelm::Error naming the path. Writes the root attribute format.
  CheckpointWriter(const std::string& path, const comm::Communicator& comm,
                   Writers writers = Writers::all);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// \brief "<path>.partial": where the file lives until close().
  static std::string partial_path(const std::string& path);

  /// \brief Collective: stores the tensor `dataset` of `global_shape`; this rank writes `block`.
  ///
  /// `data` holds block.size() floats in host memory, row-major over the block
  /// (it may be null for an empty block). Groups on the way ("/model/layers/0")
  /// are created as needed. The blocks of all ranks must tile the tensor: the
  /// writer checks that each lies inside it and that their sizes add up to the
  /// tensor's (so a forgotten block or a replica that writes is caught), and
  /// throws cubelm::InternalError on every rank otherwise. Writing a dataset
  /// twice is an InternalError too.
  void write(const std::string& dataset, const std::vector<std::uint64_t>& global_shape,
             const Block& block, const float* data);
  /// \brief As above, this rank writing elements [first, first + count) of `block` in its
  /// row-major order, which `data` holds (count floats): the ranks that share a block in
  /// flat parts (ZeRO's shards of the optimizer's moments) write their parts where they
  /// are, with no gather first. The parts of all ranks must tile the tensor.
  void write(const std::string& dataset, const std::vector<std::uint64_t>& global_shape,
             const Block& block, std::uint64_t first, std::uint64_t count, const float* data);

  /// \brief Collective: sets attribute `name` of `object` ("/" is the root; a
  /// missing group is created). Every rank passes the same value; an existing
  /// attribute of that name is replaced. The string may be of any length and
  /// hold newlines, but no NUL character.
  void set_attribute(const std::string& object, const std::string& name, const std::string& value);
  /// \brief As above, a scalar int64 attribute.
  void set_attribute(const std::string& object, const std::string& name, std::int64_t value);
  /// \brief As above, a scalar double attribute.
  void set_attribute(const std::string& object, const std::string& name, double value);
  /// \brief Any other integer (an `int` literal would be ambiguous between int64 and double).
  template <class Int, std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool> &&
                                            !std::is_same_v<Int, std::int64_t>,
                                        int> = 0>
  void set_attribute(const std::string& object, const std::string& name, Int value) {
    set_attribute(object, name, static_cast<std::int64_t>(value));
  }

  /// \brief Collective: flushes the file to storage, closes it and renames it
  /// to its final name (replacing an older file there). A failed rename is a
  /// collective cubelm::Error naming both paths; under the one writer, so is a chunk or
  /// the file's metadata that could not be written (the file then stays "<path>.partial").
  void close();

  /// \brief The final path given to the constructor.
  const std::string& path() const { return path_; }

private:
  void release() noexcept;
  /// This rank opens the file (all ranks, or the first under Writers::one).
  bool holds_file() const { return !one_writer_ || comm_.rank() == 0; }
  void write_gathered(std::int64_t dset, const std::vector<std::uint64_t>& dims,
                      std::uint64_t first, std::uint64_t count, const float* data,
                      const std::vector<std::uint64_t>& blocks);

  std::string path_;
  comm::Communicator comm_;
  /// Writers::one, or a single rank: the first rank writes the file (checkpoint_direct.hpp)
  bool one_writer_ = false;
  /// one_writer_, the first rank: why the file could not be written, by the driver or here
  /// (the file is lost; every rank learns it at the next tensor or at close())
  std::unique_ptr<direct::Failure> failure_;
  std::int64_t file_ = -1; // hid_t (kept out of this header so it need not include hdf5.h)
  std::int64_t dxpl_ = -1;
  int sync_fd_ = -1; // one_writer_: the file, for sync_file_range
  /// one_writer_, the first rank: the slab being written and the one arriving, lent to the
  /// driver
  std::unique_ptr<direct::Slabs> slabs_;
  std::vector<float> staging_[2]; // one_writer_: their blocks of columns, as they arrive
  bool closed_ = false;
};

/// \brief Reads a checkpoint file collectively; any block of any tensor.
///
/// has(), shape() and the attribute getters are independent (a rank may call
/// them alone); their errors are marked collective because every rank that
/// asks the same question of the same file gets the same answer, as when the
/// trainer checks the whole model on every rank.
class CheckpointReader {
public:
  /// \brief Collective: opens `path` for reading on every rank of `comm`.
  ///
  /// A missing or unreadable file, a file that is not HDF5, or one whose root
  /// attribute format is not "cubelm-checkpoint", is a collective cubelm::Error
  /// naming the file (rank 0 decides and tells the others).
  CheckpointReader(const std::string& path, const comm::Communicator& comm);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  /// \brief Whether a dataset exists at `dataset`.
  bool has(const std::string& dataset) const;
  /// \brief Every dataset of the file (absolute paths, in name order).
  std::vector<std::string> datasets() const;
  /// \brief The dataset carries HDF5's Fletcher32 checksum.
  bool has_checksum(const std::string& dataset) const;
  /// \brief The stored global shape; a cubelm::Error naming the file and the dataset if missing.
  std::vector<std::uint64_t> shape(const std::string& dataset) const;
  /// \brief shape(dataset), checked against `expected` with check_shape().
  void expect_shape(const std::string& dataset, const std::vector<std::uint64_t>& expected) const;

  /// \brief Collective: reads `block` of `dataset` into `out` (block.size() floats, row-major).
  ///
  /// Every rank calls it for the same dataset; a rank that needs nothing
  /// passes an empty block. A missing dataset, one that is not float32, or a
  /// block of the wrong rank or outside the stored shape on any rank is a
  /// cubelm::Error thrown on every rank.
  void read(const std::string& dataset, const Block& block, float* out) const;

  /// \brief Attribute `name` of `object` ("/" is the root); a cubelm::Error
  /// naming the file, the object and the attribute if missing or of another type.
  std::string string_attribute(const std::string& object, const std::string& name) const;
  std::int64_t int_attribute(const std::string& object, const std::string& name) const;
  double double_attribute(const std::string& object, const std::string& name) const;
  /// \brief Whether `object` exists and has an attribute `name`.
  bool has_attribute(const std::string& object, const std::string& name) const;

  /// \brief The path given to the constructor.
  const std::string& path() const { return path_; }

private:
  std::int64_t open_attribute(const std::string& object, const std::string& name) const;

  std::string path_;
  comm::Communicator comm_;
  std::int64_t file_ = -1; // hid_t
  std::int64_t dxpl_ = -1;
};

/// \brief The size of a checkpoint file that holds float32 tensors of `shapes` as
/// CheckpointWriter stores them: the data, a 4-byte Fletcher32 checksum per chunk and
/// HDF5's metadata (estimated per dataset). What `cubelm check` reports as one save.
std::uint64_t checkpoint_file_bytes(const std::vector<std::vector<std::uint64_t>>& shapes);

/// \brief What verify_checkpoint found.
struct Verification {
  std::string problem;   ///< "" when the file is sound; else what is wrong, naming file and dataset
  int datasets = 0;      ///< datasets read
  bool checksums = true; ///< every dataset carries a checksum (files of older cubelm do not)
};

/// \brief Collective: reads every dataset of the checkpoint at `path` whole (on the
/// first rank of `comm`), so that HDF5 verifies each chunk's Fletcher32 checksum.
Verification verify_checkpoint(const std::string& path, const comm::Communicator& comm);

} // namespace cubelm::io
