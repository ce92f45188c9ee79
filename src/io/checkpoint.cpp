#include "cubelm/io/checkpoint.hpp"

#include "cubelm/comm/watchdog.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/mpi_wait.hpp"

#include "checkpoint_chunks.hpp"
#include "checkpoint_direct.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <sstream>
#include <thread>
#include <type_traits>

namespace cubelm::io {

using chunking::to_hsize;

// The header stores hid_t as std::int64_t so that it need not include hdf5.h.
static_assert(std::is_same_v<hid_t, std::int64_t>, "HDF5 1.10+ has 64-bit hid_t");

namespace {

namespace fs = std::filesystem;

// While a reader works (Reading below), a failed HDF5 call is the file's damage and
// becomes an Unreadable, which the reader turns into a collective Error naming the
// file; while writing it is cubelm's failure and aborts the job (CUBELM_HDF5_CHECK).
int g_reading = 0;

struct Unreadable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void hdf5_failed(const char* call, int line) {
  if (g_reading > 0)
    throw Unreadable(std::string(call) + ": " + cubelm::detail::hdf5_error_message());
  cubelm::detail::hdf5_failure(call, __FILE__, line);
}

// Like CUBELM_HDF5_CHECK, for calls that return the identifier we go on with.
#define CUBELM_HDF5_ID(call) checked_id((call), #call, __LINE__)
hid_t checked_id(hid_t id, const char* call, int line) {
  if (id < 0)
    hdf5_failed(call, line);
  return id;
}

#undef CUBELM_HDF5_CHECK
#define CUBELM_HDF5_CHECK(call)                                                                    \
  do {                                                                                             \
    if ((call) < 0)                                                                                \
      hdf5_failed(#call, __LINE__);                                                                \
  } while (0)

/// Owns an HDF5 identifier and closes it with the matching H5?close.
class Hid {
public:
  using Closer = herr_t (*)(hid_t);
  Hid(hid_t id, Closer close) : id_(id), close_(close) {}
  ~Hid() {
    if (id_ >= 0)
      close_(id_);
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  operator hid_t() const { return id_; }

private:
  hid_t id_;
  Closer close_;
};

std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '/'))
    if (!part.empty())
      parts.push_back(part);
  return parts;
}

// "/model/wte" for "model/wte", "/model//wte/" or "/model/wte": the name messages use.
std::string absolute(const std::string& path) {
  std::string out;
  for (const auto& part : components(path))
    out += "/" + part;
  return out.empty() ? "/" : out;
}

// The first prefix of `path` that does not exist ("" if all do). H5Lexists
// fails rather than answering false when a group on the way is missing, hence
// the walk.
std::string first_missing(hid_t file, const std::string& path) {
  QuietHdf5 quiet;
  std::string prefix;
  for (const auto& part : components(path)) {
    prefix += "/" + part;
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0 ||
        H5Oexists_by_name(file, prefix.c_str(), H5P_DEFAULT) <= 0)
      return prefix;
  }
  return "";
}

bool exists(hid_t file, const std::string& path) {
  return first_missing(file, path).empty();
}

// H5I_DATASET, H5I_GROUP, ... of an existing object.
H5I_type_t object_type(hid_t file, const std::string& path) {
  Hid obj(CUBELM_HDF5_ID(H5Oopen(file, path.c_str(), H5P_DEFAULT)), H5Oclose);
  return H5Iget_type(obj);
}

// A prefix of `path` (itself excluded) that exists but is not a group, so that
// nothing can be created below it; "" if there is none.
std::string blocked_by(hid_t file, const std::string& path) {
  auto parts = components(path);
  std::string prefix;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix += "/" + parts[i];
    if (!exists(file, prefix))
      return "";
    if (object_type(file, prefix) != H5I_GROUP)
      return prefix;
  }
  return "";
}

std::uint64_t product(const std::vector<std::uint64_t>& v) {
  return std::accumulate(v.begin(), v.end(), std::uint64_t{1}, std::multiplies<>());
}

// Why `block` does not fit a tensor of `shape` ("" if it does).
std::string block_problem(const Block& block, const std::vector<std::uint64_t>& shape) {
  if (block.empty())
    return "";
  const std::string where = "offset " + shape_text(block.offset) + " count " +
                            shape_text(block.count) + " of a tensor of shape " + shape_text(shape);
  if (block.offset.size() != shape.size() || block.count.size() != shape.size())
    return "block " + where + ": the block needs " + std::to_string(shape.size()) +
           " offsets and counts";
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (block.count[d] > shape[d] || block.offset[d] > shape[d] - block.count[d])
      return "block " + where + " reaches past the end of dimension " + std::to_string(d);
  return "";
}

// Selects `block` in `filespace` and returns the matching memory space; an
// empty block selects nothing on both sides (the rank still joins the
// collective transfer).
hid_t select(const Block& block, hid_t filespace) {
  if (block.empty()) {
    const hsize_t one = 1;
    const hid_t memspace = CUBELM_HDF5_ID(H5Screate_simple(1, &one, nullptr));
    CUBELM_HDF5_CHECK(H5Sselect_none(memspace));
    CUBELM_HDF5_CHECK(H5Sselect_none(filespace));
    return memspace;
  }
  const auto start = to_hsize(block.offset);
  const auto count = to_hsize(block.count);
  CUBELM_HDF5_CHECK(
      H5Sselect_hyperslab(filespace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
  return CUBELM_HDF5_ID(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
}

// Who writes (Writers). Under MPI-IO (Writers::all on more than one rank), HDF5 allocates
// a chunked dataset's space when it creates it, and with a filter (Fletcher32) it writes
// every chunk then (filled, checksummed) before the data overwrites it: each checkpoint
// written twice. The one writer (Writers::one, or a single rank) goes through cubelm's
// direct driver (checkpoint_direct.hpp: HDF5's POSIX layout, each chunk's whole blocks
// written with O_DIRECT by a thread of their own), which allocates a chunk when it is
// written, and writes each chunk whole with its checksum computed here (write_chunks).
// Readers use MPI-IO on any number of ranks: HDF5 1.10's POSIX read path overruns a buffer
// on some damaged chunk indexes (ASan, tests/io/test_fuzz.cpp), which must be an error
// naming the file, not a crash.

// File access through MPI-IO on `comm` (HDF5 duplicates the communicator), or, with
// `one_writer` (where its failures go), through the direct driver, which takes the POSIX
// driver's file lock where the file system has locks and skips it where it does not (as
// MPI-IO never takes one).
hid_t file_access(const comm::Communicator& comm, direct::Failure* one_writer = nullptr,
                  direct::Slabs* slabs = nullptr) {
  const hid_t fapl = CUBELM_HDF5_ID(H5Pcreate(H5P_FILE_ACCESS));
  if (one_writer != nullptr)
    direct::use_driver(fapl, one_writer, slabs);
  else
    CUBELM_HDF5_CHECK(H5Pset_fapl_mpio(fapl, comm.raw(), MPI_INFO_NULL));
  return fapl;
}

// Collective transfers under MPI-IO (a filtered dataset allows no other); with `posix`,
// the default transfer.
hid_t collective_transfer(bool posix = false) {
  const hid_t dxpl = CUBELM_HDF5_ID(H5Pcreate(H5P_DATASET_XFER));
  if (!posix)
    CUBELM_HDF5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
  return dxpl;
}

const char* class_text(H5T_class_t c) {
  return c == H5T_INTEGER  ? "an integer"
         : c == H5T_FLOAT  ? "a floating-point number"
         : c == H5T_STRING ? "a string"
                           : "of another HDF5 type";
}

// Reads a scalar string attribute, variable-length (ours, h5py's) or
// fixed-length (other writers). Returns a complaint, or "" with `out` set.
std::string read_string(hid_t attr, std::string& out) {
  Hid type(CUBELM_HDF5_ID(H5Aget_type(attr)), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING)
    return std::string("is ") + class_text(H5Tget_class(type)) + ", not a string";
  Hid space(CUBELM_HDF5_ID(H5Aget_space(attr)), H5Sclose);
  if (H5Sget_simple_extent_npoints(space) != 1)
    return "holds " + std::to_string(H5Sget_simple_extent_npoints(space)) + " strings, not one";
  if (H5Tis_variable_str(type) > 0) {
    Hid mem(CUBELM_HDF5_ID(H5Tcopy(H5T_C_S1)), H5Tclose);
    CUBELM_HDF5_CHECK(H5Tset_size(mem, H5T_VARIABLE));
    CUBELM_HDF5_CHECK(H5Tset_cset(mem, H5Tget_cset(type)));
    char* text = nullptr;
    CUBELM_HDF5_CHECK(H5Aread(attr, mem, &text));
    out = text ? text : "";
    H5free_memory(text);
  } else {
    std::vector<char> text(H5Tget_size(type));
    CUBELM_HDF5_CHECK(H5Aread(attr, type, text.data()));
    out.assign(text.data(), strnlen(text.data(), text.size())); // drops NUL padding
  }
  return "";
}

// Reads a scalar number attribute of class `want` (or an integer, if
// `accept_integer`) converted to `mem`. Returns a complaint, or "".
std::string read_number(hid_t attr, H5T_class_t want, bool accept_integer, hid_t mem, void* out) {
  Hid type(CUBELM_HDF5_ID(H5Aget_type(attr)), H5Tclose);
  const H5T_class_t c = H5Tget_class(type);
  if (c != want && !(accept_integer && c == H5T_INTEGER))
    return std::string("is ") + class_text(c) + ", not " + class_text(want);
  Hid space(CUBELM_HDF5_ID(H5Aget_space(attr)), H5Sclose);
  if (H5Sget_simple_extent_npoints(space) != 1)
    return "holds " + std::to_string(H5Sget_simple_extent_npoints(space)) + " values, not one";
  CUBELM_HDF5_CHECK(H5Aread(attr, mem, out));
  return "";
}

// Marks the reader at work: failed HDF5 calls throw Unreadable (see hdf5_failed).
class Reading {
public:
  Reading() { ++g_reading; }
  ~Reading() { --g_reading; }
  Reading(const Reading&) = delete;
  Reading& operator=(const Reading&) = delete;

private:
  QuietHdf5 quiet_; // the damage is reported once, by the Error
};

Error damaged(const std::string& path, const Unreadable& e) {
  return Error("checkpoint " + path + ": damaged: HDF5 cannot read it (" + std::string(e.what()) +
                   ")",
               true);
}

// inspect's HDF5 part, for a file that exists and can be read.
std::string inspect_hdf5(const std::string& path, const std::string& intro) {
  if (H5Fis_hdf5(path.c_str()) <= 0)
    return intro + "not an HDF5 file (a cubelm checkpoint is one, with the root attribute " +
           "format = \"" + checkpoint_format + "\")";
  const hid_t raw = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (raw < 0)
    return intro + "cannot be opened by HDF5 (damaged or truncated? on a file system without " +
           "file locking, set HDF5_USE_FILE_LOCKING=FALSE)";
  Hid file(raw, H5Fclose);
  if (H5Aexists(file, "format") <= 0)
    return intro + "no root attribute format: not a cubelm checkpoint (it needs format = \"" +
           checkpoint_format + "\")";
  Hid attr(CUBELM_HDF5_ID(H5Aopen(file, "format", H5P_DEFAULT)), H5Aclose);
  std::string format;
  const std::string problem = read_string(attr, format);
  if (!problem.empty())
    return intro + "the root attribute format " + problem + " (it must be \"" + checkpoint_format +
           "\")";
  if (format != checkpoint_format)
    return intro + "root attribute format = \"" + format + "\": not a cubelm checkpoint (it " +
           "must be \"" + checkpoint_format + "\")";
  return "";
}

// Rank 0's verdict on a file about to be opened as a checkpoint ("" if fine).
std::string inspect(const std::string& path) {
  const std::string intro = "checkpoint " + path + ": ";
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status))
    return intro + "no such file";
  if (fs::is_directory(status))
    return intro + "is a directory, not a checkpoint file";
  if (::access(path.c_str(), R_OK) != 0)
    return intro + "cannot be read: " + std::strerror(errno);
  try {
    const Reading reading; // a damaged format attribute is the file's fault too
    return inspect_hdf5(path, intro);
  } catch (const Unreadable& e) {
    return damaged(path, e).what();
  }
}

// Opens `object`, creating it as a group (with the groups above it) if missing.
hid_t open_or_create(hid_t file, const std::string& object) {
  if (object == "/" || exists(file, object))
    return CUBELM_HDF5_ID(H5Oopen(file, object.c_str(), H5P_DEFAULT));
  Hid lcpl(CUBELM_HDF5_ID(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  CUBELM_HDF5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  return CUBELM_HDF5_ID(H5Gcreate2(file, object.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT));
}

// Writes a scalar attribute, replacing one of the same name.
void put_attribute(hid_t file, const std::string& path, const std::string& object,
                   const std::string& name, hid_t file_type, hid_t mem_type, const void* value) {
  const std::string where = absolute(object);
  if (const std::string in_the_way = blocked_by(file, where); !in_the_way.empty())
    throw InternalError("checkpoint " + path + ": attribute " + name + " of " + where + ": " +
                        in_the_way + " is a dataset, not a group");
  Hid obj(open_or_create(file, where), H5Oclose);
  if (CUBELM_HDF5_ID(H5Aexists(obj, name.c_str())) > 0)
    CUBELM_HDF5_CHECK(H5Adelete(obj, name.c_str()));
  Hid space(CUBELM_HDF5_ID(H5Screate(H5S_SCALAR)), H5Sclose);
  Hid attr(
      CUBELM_HDF5_ID(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT)),
      H5Aclose);
  CUBELM_HDF5_CHECK(H5Awrite(attr, mem_type, value));
}

// Why `name` is not a readable dataset of `file` ("" if it is).
std::string dataset_problem(hid_t file, const std::string& name) {
  const std::string missing = first_missing(file, name);
  if (missing == name)
    return "no dataset " + name;
  if (!missing.empty())
    return "no dataset " + name + " (there is no " + missing + ")";
  if (object_type(file, name) != H5I_DATASET)
    return name + " is a group, not a dataset";
  return "";
}

// The reader's Error for `problem` with attribute `name` of `object`, if there is one.
void throw_if(const std::string& problem, const std::string& path, const std::string& object,
              const std::string& name) {
  if (!problem.empty())
    throw Error("checkpoint " + path + ": attribute " + name + " of " + absolute(object) + " " +
                    problem,
                true);
}

} // namespace

// ---------------------------------------------------------------------------
// Shapes (Block's geometry: checkpoint_blocks.cpp)

void check_shape(const std::string& file, const std::string& dataset,
                 const std::vector<std::uint64_t>& stored,
                 const std::vector<std::uint64_t>& expected) {
  if (stored != expected)
    throw Error("checkpoint " + file + ": " + absolute(dataset) + " has shape " +
                    shape_text(stored) + ", the deck needs " + shape_text(expected),
                true);
}

// Checkpoint I/O waits for every rank (collective HDF5 and MPI calls): the hang
// watchdog watches each call as a wait on the group "checkpoint".
namespace {
const char* checkpoint_group() {
  static const char* const name = comm::watchdog::intern("checkpoint");
  return name;
}
} // namespace

// ---------------------------------------------------------------------------
// CheckpointWriter

std::string CheckpointWriter::partial_path(const std::string& path) {
  return path + ".partial";
}

CheckpointWriter::CheckpointWriter(const std::string& path, const comm::Communicator& comm,
                                   Writers writers)
    : path_(path), comm_(comm) {
  const comm::watchdog::Scope watched(checkpoint_group(), "create");
  CUBELM_ASSERT(comm_, "CheckpointWriter needs a communicator");
  // MPI-IO would fail on some ranks or all in its own way; rank 0 looks first.
  std::string problem;
  if (comm_.rank() == 0) {
    const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : ".";
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      problem = "checkpoint " + path + ": the directory " + dir.string() + " does not exist";
    else if (::access(dir.c_str(), W_OK | X_OK) != 0)
      problem = "checkpoint " + path + ": cannot write into the directory " + dir.string() + ": " +
                std::strerror(errno);
    else if (fs::is_directory(path, ec))
      problem = "checkpoint " + path + ": is a directory, cannot write a checkpoint file there";
  }
  problem = comm::agree(comm_, problem);
  if (!problem.empty())
    throw Error(problem, true);

  one_writer_ = writers == Writers::one || comm_.size() == 1;
  if (holds_file()) {
    if (one_writer_) {
      failure_ = std::make_unique<direct::Failure>();
      slabs_ = std::make_unique<direct::Slabs>();
    }
    Hid fapl(file_access(comm_, failure_.get(), slabs_.get()), H5Pclose);
    // Metadata written collectively scales better than rank 0 writing it alone.
    if (!one_writer_)
      CUBELM_HDF5_CHECK(H5Pset_coll_metadata_write(fapl, 1));
    file_ =
        CUBELM_HDF5_ID(H5Fcreate(partial_path(path_).c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    dxpl_ = collective_transfer(one_writer_);
    // The one writer's own descriptor of the file, to start writeback as it goes (HDF5's
    // POSIX driver keeps its descriptor to itself).
    if (one_writer_)
      sync_fd_ = ::open(partial_path(path_).c_str(), O_RDONLY | O_CLOEXEC);
  }
  set_attribute("/", "format", std::string(checkpoint_format));
}

CheckpointWriter::~CheckpointWriter() {
  release();
}

void CheckpointWriter::release() noexcept {
  if (slabs_) // the driver's thread reads the slabs until it has written them
    slabs_->settle();
  if (sync_fd_ >= 0)
    ::close(sync_fd_);
  sync_fd_ = -1;
  if (dxpl_ >= 0)
    H5Pclose(dxpl_);
  if (file_ >= 0)
    H5Fclose(file_);
  dxpl_ = file_ = -1;
}

void CheckpointWriter::write(const std::string& dataset,
                             const std::vector<std::uint64_t>& global_shape, const Block& block,
                             const float* data) {
  write(dataset, global_shape, block, 0, block.size(), data);
}

void CheckpointWriter::write(const std::string& dataset,
                             const std::vector<std::uint64_t>& global_shape, const Block& block,
                             std::uint64_t first, std::uint64_t count, const float* data) {
  const comm::watchdog::Scope watched(checkpoint_group(), "write");
  CUBELM_ASSERT(!closed_, "CheckpointWriter::write after close()");
  const std::string name = absolute(dataset);
  std::string problem;
  if (name == "/" || global_shape.empty())
    problem = "a tensor needs a name and at least one dimension";
  else if (holds_file() && exists(file_, name))
    problem = "written twice";
  else if (const std::string in_the_way = holds_file() ? blocked_by(file_, name) : "";
           !in_the_way.empty())
    problem = in_the_way + " is a dataset, not a group";
  else if (count > 0 && data == nullptr)
    problem = "rank " + std::to_string(comm_.rank()) + " passed no data for its block";
  else if (const std::string p = block_problem(block, global_shape); !p.empty())
    problem = "rank " + std::to_string(comm_.rank()) + ": " + p;
  else if (count > 0 && (first > block.size() || count > block.size() - first))
    problem = "rank " + std::to_string(comm_.rank()) + ": elements [" + std::to_string(first) +
              ", " + std::to_string(first + count) + ") of a block of " +
              std::to_string(block.size());
  // Blocks that overlap (a replica writing too) or leave a gap (nobody writing a part)
  // would go unnoticed on disk; their total size tells.
  const auto tiling = [&](std::uint64_t total) -> std::string {
    if (total == product(global_shape))
      return "";
    return "the blocks of all ranks hold " + std::to_string(total) + " elements, the tensor " +
           shape_text(global_shape) + " has " + std::to_string(product(global_shape)) +
           ": every element must be written by exactly one rank (replicas pass an empty Block)";
  };
  // A chunk the one writer could not write ends the checkpoint on every rank, at the next
  // tensor: its message travels with the agreement, marked so.
  constexpr char kWriteFailed = '\x1e';
  if (failure_ && failure_->failed()) // the driver's writes in flight or done, and ours
    problem = kWriteFailed + failure_->first();
  // The one writer: every rank learns every rank's block (offsets, counts, and whether the
  // rank found a problem) in one collective per tensor, and so checks their total and
  // whether anyone failed by itself; the problems' text travels only when there is one.
  // (Two collectives per tensor, a gather and an agreement, cost a GPT-2 124M save on 8
  // ranks sharing 2 cores about 0.2 s of 1.1.)
  // Each rank's entry: its block's offsets and counts, the first and the number of its
  // elements it writes, and whether it found a problem.
  const std::size_t nd = global_shape.size(), stride = 2 * nd + 3;
  std::vector<std::uint64_t> blocks;
  if (one_writer_) {
    std::vector<std::uint64_t> mine(stride, 0);
    mine[2 * nd + 2] = problem.empty() ? 0 : 1;
    if (problem.empty() && count > 0) {
      for (std::size_t d = 0; d < nd; ++d) {
        mine[d] = block.offset[d];
        mine[nd + d] = block.count[d];
      }
      mine[2 * nd] = first;
      mine[2 * nd + 1] = count;
    }
    blocks.resize(stride * static_cast<std::size_t>(comm_.size()));
    // The other ranks wait here while the writer writes the previous tensor: asleep.
    std::vector<MPI_Request> gathered(1);
    CUBELM_MPI_CHECK(MPI_Iallgather(mine.data(), static_cast<int>(stride), MPI_UINT64_T,
                                    blocks.data(), static_cast<int>(stride), MPI_UINT64_T,
                                    comm_.raw(), gathered.data()));
    wait_all(gathered, comm_.rank() != 0);
    std::uint64_t total = 0;
    bool failed = false;
    for (int q = 0; q < comm_.size(); ++q) {
      const std::uint64_t* b = blocks.data() + stride * static_cast<std::size_t>(q);
      failed = failed || b[2 * nd + 2] != 0;
      total += b[2 * nd + 1];
    }
    problem = failed ? comm::agree(comm_, problem) : tiling(total);
  } else {
    problem = comm::agree(comm_, problem);
  }
  if (!problem.empty() && problem[0] == kWriteFailed)
    throw Error("checkpoint " + path_ + ": " + problem.substr(1), true);
  if (!problem.empty())
    throw InternalError("checkpoint " + path_ + ": " + name + ": " + problem);
  if (!one_writer_) {
    const std::uint64_t mine = count;
    std::uint64_t total = 0;
    CUBELM_MPI_CHECK(MPI_Allreduce(&mine, &total, 1, MPI_UINT64_T, MPI_SUM, comm_.raw()));
    if (const std::string wrong = tiling(total); !wrong.empty())
      throw InternalError("checkpoint " + path_ + ": " + name + ": " + wrong);
  }

  const auto dims = to_hsize(global_shape);
  if (!holds_file()) { // Writers::one: the first rank creates the dataset and writes our block
    write_gathered(-1, global_shape, first, count, data, blocks);
    return;
  }
  Hid filespace(
      CUBELM_HDF5_ID(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
      H5Sclose);
  Hid lcpl(CUBELM_HDF5_ID(H5Pcreate(H5P_LINK_CREATE)), H5Pclose);
  CUBELM_HDF5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  Hid dcpl(CUBELM_HDF5_ID(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  // Every element is written below; filling first would write the file twice.
  CUBELM_HDF5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  // Chunks of at most 2^20 elements (chunking::chunk_of) with HDF5's Fletcher32 checksum: every
  // reader (cubelm, h5py, h5dump) verifies each chunk it reads.
  const auto chunk = chunking::chunk_of(dims);
  CUBELM_HDF5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
  CUBELM_HDF5_CHECK(H5Pset_fletcher32(dcpl));
  Hid dset(CUBELM_HDF5_ID(
               H5Dcreate2(file_, name.c_str(), H5T_IEEE_F32LE, filespace, lcpl, dcpl, H5P_DEFAULT)),
           H5Dclose);

  if (one_writer_) {
    write_gathered(dset, global_shape, first, count, data, blocks);
    return;
  }
  // A part of the block: the union of its runs' blocks, which HDF5 fills in the file's
  // row-major order, the part's own.
  const auto selected = [&]() -> hid_t {
    if (count == 0 || count == block.size())
      return select(count == 0 ? Block::none() : block, filespace);
    CUBELM_HDF5_CHECK(H5Sselect_none(filespace));
    for (const Block& b : block.run(first, count)) {
      const auto start = to_hsize(b.offset), extent = to_hsize(b.count);
      CUBELM_HDF5_CHECK(H5Sselect_hyperslab(filespace, H5S_SELECT_OR, start.data(), nullptr,
                                            extent.data(), nullptr));
    }
    const hsize_t n = count;
    return CUBELM_HDF5_ID(H5Screate_simple(1, &n, nullptr));
  };
  Hid memspace(selected(), H5Sclose);
  const float dummy = 0.0f; // HDF5 wants a buffer even when nothing is selected
  CUBELM_HDF5_CHECK(
      H5Dwrite(dset, H5T_NATIVE_FLOAT, memspace, filespace, dxpl_, count == 0 ? &dummy : data));
}

void CheckpointWriter::set_attribute(const std::string& object, const std::string& name,
                                     const std::string& value) {
  CUBELM_ASSERT(!closed_, "CheckpointWriter::set_attribute after close()");
  if (!holds_file())
    return;
  // A variable-length string ends at its first NUL; the rest would be lost silently.
  CUBELM_ASSERT(value.find('\0') == std::string::npos,
                "string attribute " + name + " holds a NUL character");
  Hid type(CUBELM_HDF5_ID(H5Tcopy(H5T_C_S1)), H5Tclose);
  CUBELM_HDF5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  CUBELM_HDF5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  const char* text = value.c_str();
  put_attribute(file_, path_, object, name, type, type, &text);
}

void CheckpointWriter::set_attribute(const std::string& object, const std::string& name,
                                     std::int64_t value) {
  CUBELM_ASSERT(!closed_, "CheckpointWriter::set_attribute after close()");
  if (!holds_file())
    return;
  put_attribute(file_, path_, object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void CheckpointWriter::set_attribute(const std::string& object, const std::string& name,
                                     double value) {
  CUBELM_ASSERT(!closed_, "CheckpointWriter::set_attribute after close()");
  if (!holds_file())
    return;
  put_attribute(file_, path_, object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

namespace {

// Test hook: CUBELM_TEST_PAUSE_BEFORE_RENAME=<file name> stops rank 0 for good once the
// data of that checkpoint is written, flushed and closed on every rank but before the
// rename, so that a test can kill the job at the worst moment (docs/reliability.md);
// "<file name>:<ms>" pauses that long instead (a background write that a test signals
// the job during).
void pause_before_rename(const std::string& path) {
  const char* value = std::getenv("CUBELM_TEST_PAUSE_BEFORE_RENAME");
  if (value == nullptr)
    return;
  const std::string hook = value;
  const std::size_t colon = hook.find(':');
  if (fs::path(path).filename() != hook.substr(0, colon))
    return;
  const long ms = colon == std::string::npos ? -1 : std::atol(hook.c_str() + colon + 1);
  std::fprintf(stderr, "cubelm: test hook: rank 0 (pid %ld) paused before renaming %s%s\n",
               static_cast<long>(::getpid()), path.c_str(),
               ms >= 0 ? (" for " + std::to_string(ms) + " ms").c_str() : "");
  std::fflush(stderr);
  if (ms >= 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return;
  }
  for (;;)
    ::pause();
}

} // namespace

void CheckpointWriter::close() {
  const comm::watchdog::Scope watched(checkpoint_group(), "close");
  CUBELM_ASSERT(!closed_, "CheckpointWriter::close called twice");
  closed_ = true;
  // The data is on storage before the rename makes it the checkpoint: flushing syncs
  // the MPI-IO file; the one writer's file is synced once closed.
  if (holds_file() && !failure_) {
    CUBELM_HDF5_CHECK(H5Fflush(file_, H5F_SCOPE_GLOBAL));
  } else if (failure_ && !failure_->failed()) { // the last chunks and the metadata
    QuietHdf5 quiet;
    if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0)
      failure_->record(cubelm::detail::hdf5_error_message());
  }
  release();
  // One writer: what the driver or the flush could not write, up to the file's close.
  std::string problem = failure_ ? failure_->first() : "";
  if (!problem.empty())
    problem = "checkpoint " + path_ + ": " + problem;
  else if (one_writer_ && holds_file()) {
    const int fd = ::open(partial_path(path_).c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0)
      problem = "checkpoint " + path_ + ": cannot sync " + partial_path(path_) +
                " to storage: " + std::strerror(errno);
    if (fd >= 0)
      ::close(fd);
  }
  // Every rank has closed the file before rank 0 gives it its final name (under one
  // writer the others wait for its sync asleep).
  if (one_writer_) {
    std::vector<MPI_Request> barrier(1);
    CUBELM_MPI_CHECK(MPI_Ibarrier(comm_.raw(), barrier.data()));
    wait_all(barrier, comm_.rank() != 0);
  } else {
    CUBELM_MPI_CHECK(MPI_Barrier(comm_.raw()));
  }
  if (comm_.rank() == 0)
    pause_before_rename(path_);
  if (problem.empty() && comm_.rank() == 0 &&
      std::rename(partial_path(path_).c_str(), path_.c_str()) != 0)
    problem = "checkpoint " + path_ + ": cannot rename " + partial_path(path_) +
              " to it: " + std::strerror(errno);
  problem = comm::agree(comm_, problem);
  if (!problem.empty())
    throw Error(problem, true);
}

// ---------------------------------------------------------------------------
// CheckpointReader
//
// A damaged file makes HDF5 calls fail while reading: that is the file's fault,
// not cubelm's, so the reader turns such failures into a collective cubelm::Error
// naming the file (every rank reads the same bytes and fails alike) instead of
// aborting the job as CUBELM_HDF5_CHECK does.

CheckpointReader::CheckpointReader(const std::string& path, const comm::Communicator& comm)
    : path_(path), comm_(comm) {
  const comm::watchdog::Scope watched(checkpoint_group(), "open");
  CUBELM_ASSERT(comm_, "CheckpointReader needs a communicator");
  // A parallel open of a file that is not HDF5 may fail differently on
  // different ranks; rank 0 decides for everyone before anyone tries.
  const std::string problem = comm::agree(comm_, comm_.rank() == 0 ? inspect(path_) : "");
  if (!problem.empty())
    throw Error(problem, true);
  Hid fapl(file_access(comm_), H5Pclose);
  try {
    const Reading reading;
    file_ = CUBELM_HDF5_ID(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl));
  } catch (const Unreadable& e) {
    throw damaged(path_, e);
  }
  dxpl_ = collective_transfer();
}

CheckpointReader::~CheckpointReader() {
  if (dxpl_ >= 0)
    H5Pclose(dxpl_);
  if (file_ >= 0)
    H5Fclose(file_);
}

bool CheckpointReader::has(const std::string& dataset) const try {
  const Reading reading;
  const std::string name = absolute(dataset);
  return name != "/" && dataset_problem(file_, name).empty();
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

std::vector<std::uint64_t> CheckpointReader::shape(const std::string& dataset) const try {
  const Reading reading;
  const std::string name = absolute(dataset);
  if (const std::string problem = dataset_problem(file_, name); !problem.empty())
    throw Error("checkpoint " + path_ + ": " + problem, true);
  Hid dset(CUBELM_HDF5_ID(H5Dopen2(file_, name.c_str(), H5P_DEFAULT)), H5Dclose);
  Hid space(CUBELM_HDF5_ID(H5Dget_space(dset)), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  CUBELM_HDF5_CHECK(rank);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  CUBELM_HDF5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  return std::vector<std::uint64_t>(dims.begin(), dims.end());
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

void CheckpointReader::expect_shape(const std::string& dataset,
                                    const std::vector<std::uint64_t>& expected) const {
  check_shape(path_, dataset, shape(dataset), expected);
}

void CheckpointReader::read(const std::string& dataset, const Block& block, float* out) const try {
  const Reading reading;
  const comm::watchdog::Scope watched(checkpoint_group(), "read");
  const std::string name = absolute(dataset);
  std::string problem = dataset_problem(file_, name);
  if (problem.empty()) {
    Hid dset(CUBELM_HDF5_ID(H5Dopen2(file_, name.c_str(), H5P_DEFAULT)), H5Dclose);
    Hid type(CUBELM_HDF5_ID(H5Dget_type(dset)), H5Tclose);
    if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != 4)
      problem = name + " is " + class_text(H5Tget_class(type)) + " of " +
                std::to_string(H5Tget_size(type)) + " bytes, not float32";
    else if (!block.empty() && out == nullptr)
      problem = "rank " + std::to_string(comm_.rank()) + " passed no buffer for its block";
    else if (const std::string p = block_problem(block, shape(name)); !p.empty())
      problem = name + ": rank " + std::to_string(comm_.rank()) + " asked for " + p;
  }
  problem = comm::agree(comm_, problem);
  if (!problem.empty())
    throw Error("checkpoint " + path_ + ": " + problem, true);

  Hid dset(CUBELM_HDF5_ID(H5Dopen2(file_, name.c_str(), H5P_DEFAULT)), H5Dclose);
  Hid filespace(CUBELM_HDF5_ID(H5Dget_space(dset)), H5Sclose);
  Hid memspace(select(block, filespace), H5Sclose);
  float dummy = 0.0f; // HDF5 wants a buffer even when nothing is selected
  herr_t status = 0;
  {
    QuietHdf5 quiet; // a damaged chunk is the user's file, not a failed call
    status =
        H5Dread(dset, H5T_NATIVE_FLOAT, memspace, filespace, dxpl_, block.empty() ? &dummy : out);
  }
  problem =
      comm::agree(comm_, status < 0 ? name + ": cannot be read: a Fletcher32 checksum does not "
                                             "match or the data is cut short (the file is damaged)"
                                    : "");
  if (!problem.empty())
    throw Error("checkpoint " + path_ + ": " + problem, true);
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

bool CheckpointReader::has_attribute(const std::string& object, const std::string& name) const try {
  const Reading reading;
  const std::string where = absolute(object);
  if (where != "/" && !exists(file_, where))
    return false;
  QuietHdf5 quiet;
  return H5Aexists_by_name(file_, where.c_str(), name.c_str(), H5P_DEFAULT) > 0;
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

std::int64_t CheckpointReader::open_attribute(const std::string& object,
                                              const std::string& name) const try {
  const Reading reading;
  const std::string where = absolute(object);
  if (where != "/" && !exists(file_, where))
    throw Error("checkpoint " + path_ + ": no " + where + " (looking for its attribute " + name +
                    ")",
                true);
  if (!has_attribute(where, name))
    throw Error("checkpoint " + path_ + ": " + where + " has no attribute " + name, true);
  return CUBELM_HDF5_ID(
      H5Aopen_by_name(file_, where.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

std::string CheckpointReader::string_attribute(const std::string& object,
                                               const std::string& name) const try {
  const Reading reading;
  Hid attr(open_attribute(object, name), H5Aclose);
  std::string value;
  throw_if(read_string(attr, value), path_, object, name);
  return value;
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

std::int64_t CheckpointReader::int_attribute(const std::string& object,
                                             const std::string& name) const try {
  const Reading reading;
  Hid attr(open_attribute(object, name), H5Aclose);
  std::int64_t value = 0;
  throw_if(read_number(attr, H5T_INTEGER, false, H5T_NATIVE_INT64, &value), path_, object, name);
  return value;
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

double CheckpointReader::double_attribute(const std::string& object, const std::string& name) const
    try {
  const Reading reading;
  Hid attr(open_attribute(object, name), H5Aclose);
  double value = 0;
  // An integer is a number too (an h5py user may well write lr = 1).
  throw_if(read_number(attr, H5T_FLOAT, true, H5T_NATIVE_DOUBLE, &value), path_, object, name);
  return value;
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

namespace {
// The datasets below group `where` (recursively), through calls whose signatures are
// the same in HDF5 1.10 to 1.14 (H5Ovisit and H5Lvisit changed theirs in 1.12).
void collect_datasets(hid_t file, const std::string& where, std::vector<std::string>& out) {
  Hid group(CUBELM_HDF5_ID(H5Gopen2(file, where.c_str(), H5P_DEFAULT)), H5Gclose);
  H5G_info_t info;
  CUBELM_HDF5_CHECK(H5Gget_info(group, &info));
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n =
        H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    CUBELM_HDF5_CHECK(n);
    std::string name(static_cast<std::size_t>(n) + 1, '\0');
    CUBELM_HDF5_CHECK(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                                         name.size(), H5P_DEFAULT));
    name.resize(static_cast<std::size_t>(n));
    const std::string path = (where == "/" ? "" : where) + "/" + name;
    Hid object(CUBELM_HDF5_ID(H5Oopen(file, path.c_str(), H5P_DEFAULT)), H5Oclose);
    const H5I_type_t type = H5Iget_type(object);
    if (type == H5I_DATASET)
      out.push_back(path);
    else if (type == H5I_GROUP)
      collect_datasets(file, path, out);
  }
}
} // namespace

bool CheckpointReader::has_checksum(const std::string& dataset) const try {
  const Reading reading;
  Hid dset(CUBELM_HDF5_ID(H5Dopen2(file_, absolute(dataset).c_str(), H5P_DEFAULT)), H5Dclose);
  Hid dcpl(CUBELM_HDF5_ID(H5Dget_create_plist(dset)), H5Pclose);
  for (int i = 0; i < H5Pget_nfilters(dcpl); ++i) {
    unsigned flags = 0;
    std::size_t n = 0;
    if (H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &n, nullptr, 0, nullptr, nullptr) ==
        H5Z_FILTER_FLETCHER32)
      return true;
  }
  return false;
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

std::vector<std::string> CheckpointReader::datasets() const try {
  const Reading reading;
  std::vector<std::string> out;
  collect_datasets(file_, "/", out);
  return out;
} catch (const Unreadable& e) {
  throw damaged(path_, e);
}

Verification verify_checkpoint(const std::string& path, const comm::Communicator& comm) {
  Verification v;
  try {
    const CheckpointReader reader(path, comm);
    std::error_code ec;
    const std::uint64_t file_bytes = fs::file_size(path, ec);
    for (const std::string& name : reader.datasets()) {
      const std::vector<std::uint64_t> shape = reader.shape(name);
      // Stored uncompressed: a dataset larger than the file is damaged metadata, not
      // something to allocate.
      const std::uint64_t elements = product(shape);
      if (elements > file_bytes / 4)
        throw Error("checkpoint " + path + ": damaged: " + name + " declares " + shape_text(shape) +
                        " float32 elements, more than the " + std::to_string(file_bytes) +
                        "-byte file can hold",
                    true);
      const Block block = comm.rank() == 0 ? Block::whole(shape) : Block::none();
      std::vector<float> data(block.size());
      reader.read(name, block, data.data());
      v.checksums = v.checksums && reader.has_checksum(name);
      ++v.datasets;
    }
  } catch (const Error& e) {
    if (!e.collective())
      throw;
    v.problem = e.what();
  }
  return v;
}

} // namespace cubelm::io
