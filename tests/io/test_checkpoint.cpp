// Parallel HDF5 checkpoints: tensors written in one decomposition come back
// element for element in another, attributes round trip, the file appears
// under its final name only when complete, and every user error is a
// cubelm::Error on every rank (no hang) that names the file.
//
// Expected values are closed forms of the indices (100 i + j, ...), never
// what another part of the checkpoint code computed.

#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/io/checkpoint.hpp"

#include "checkpoint_chunks.hpp"
#include "test_helpers.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::io;
namespace fs = std::filesystem;
using Shape = std::vector<std::uint64_t>;

namespace {

// A file name in the temporary directory all ranks of this node share, unique
// per test, rank count and run (ctest runs the 1-, 2- and 4-rank jobs side by
// side). Rank 0 removes the file and its .partial after the test.
class TempPath {
public:
  explicit TempPath(const comm::Communicator& comm, const std::string& suffix = "") : comm_(comm) {
    int pid = static_cast<int>(::getpid());
    MPI_Bcast(&pid, 1, MPI_INT, 0, comm.raw());
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = (fs::temp_directory_path() /
             ("cubelm_test_ckpt_" + test + suffix + "_" + std::to_string(comm.size()) + "_" +
              std::to_string(pid) + ".h5"))
                .string();
  }
  ~TempPath() {
    MPI_Barrier(comm_.raw());
    if (comm_.rank() == 0) {
      std::error_code ec;
      fs::remove(path_, ec);
      fs::remove(CheckpointWriter::partial_path(path_), ec);
    }
  }
  const std::string& str() const { return path_; }

private:
  comm::Communicator comm_;
  std::string path_;
};

// The message of the collective cubelm::Error that `f` throws: checkpoint errors are
// raised on every rank.
std::string error_of(const std::function<void()>& f) {
  return cubelm::testing::error_of(f, true);
}

using cubelm::testing::internal_error_of;

// Tensor `name` of `shape` of the checkpoint at `path`, whole, on every rank.
std::vector<float> read_whole(const std::string& path, const comm::Communicator& world,
                              const std::string& name, const Shape& shape) {
  CheckpointReader rd(path, world);
  const Block all = Block::whole(shape);
  std::vector<float> values(static_cast<std::size_t>(all.size()));
  rd.read(name, all, values.data());
  return values;
}

// The values of the one writer's wide tests, and how many elements of a whole 2-D
// tensor differ from them.
float wide_value(std::uint64_t i, std::uint64_t j) {
  return static_cast<float>(i * 1000 + j);
}
int wrong_wide_elements(const std::vector<float>& got, const Shape& shape) {
  int wrong = 0;
  for (std::uint64_t i = 0; i < shape[0]; ++i)
    for (std::uint64_t j = 0; j < shape[1]; ++j)
      wrong += got[i * shape[1] + j] != wide_value(i, j);
  return wrong;
}

// Rows [begin, end) of `rows` that rank r of p owns: a deliberately uneven
// split (quadratic boundaries) in which low ranks may own nothing.
std::pair<std::uint64_t, std::uint64_t> uneven(std::uint64_t rows, int r, int p) {
  const auto edge = [&](int k) { return rows * k * k / (static_cast<std::uint64_t>(p) * p); };
  return {edge(r), edge(r + 1)};
}

// Part [begin, end) of `n` for rank r of p, split as evenly as possible.
std::pair<std::uint64_t, std::uint64_t> even(std::uint64_t n, int r, int p) {
  return {n * r / p, n * (r + 1) / p};
}

// The closed forms the tensors hold.
float matrix_value(std::uint64_t i, std::uint64_t j) {
  return static_cast<float>(100 * i + j);
}
float vector_value(std::uint64_t k) {
  return 0.5f * static_cast<float>(k) - 3.0f;
}
float replica_value(std::uint64_t i, std::uint64_t j) {
  return static_cast<float>(4 * i + j) + 0.25f;
}
float cube_value(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return -static_cast<float>(1000 * a + 100 * b + c);
}

// The elements of `block` of a 2-D tensor holding f(i, j), row-major.
std::vector<float> fill2(const Block& block, float (*f)(std::uint64_t, std::uint64_t)) {
  std::vector<float> v;
  for (std::uint64_t i = 0; i < block.count[0]; ++i)
    for (std::uint64_t j = 0; j < block.count[1]; ++j)
      v.push_back(f(block.offset[0] + i, block.offset[1] + j));
  return v;
}

std::vector<float> fill1(const Block& block) {
  std::vector<float> v;
  for (std::uint64_t k = 0; k < block.count[0]; ++k)
    v.push_back(vector_value(block.offset[0] + k));
  return v;
}

const Shape matrix_shape{7, 5}, vector_shape{13}, replica_shape{3, 4}, cube_shape{2, 3, 4};
// One chunk whose bytes and checksum fill 64 KiB exactly.
const Shape kBlockChunk{16383};

// Writes the test tensors with `comm`: the matrix by uneven rows, the vector
// by the last rank alone, the replicated tensor by rank 0 only, the 3-D
// tensor split along its middle dimension.
void write_tensors(CheckpointWriter& w, const comm::Communicator& comm) {
  const int r = comm.rank(), p = comm.size();
  const auto [r0, r1] = uneven(matrix_shape[0], r, p);
  const Block rows = Block::rows(matrix_shape, r0, r1);
  const std::vector<float> mine = fill2(rows, matrix_value);
  w.write("/model/wte", matrix_shape, rows, mine.data());

  const std::vector<float> vec = fill1(Block::whole(vector_shape));
  w.write("/model/ln_f/gamma", vector_shape,
          r == p - 1 ? Block::whole(vector_shape) : Block::none(), vec.data());

  // Every rank holds the replica; only rank 0 writes it.
  const std::vector<float> replica = fill2(Block::whole(replica_shape), replica_value);
  w.write("/model/layers/0/attn/wq", replica_shape,
          r == 0 ? Block::whole(replica_shape) : Block::none(), replica.data());

  const auto [b0, b1] = even(cube_shape[1], r, p);
  const Block slab{{0, b0, 0}, {cube_shape[0], b1 - b0, cube_shape[2]}};
  std::vector<float> cube;
  for (std::uint64_t a = 0; a < slab.count[0]; ++a)
    for (std::uint64_t b = b0; b < b1; ++b)
      for (std::uint64_t c = 0; c < cube_shape[2]; ++c)
        cube.push_back(cube_value(a, b, c));
  w.write("/optimizer/m/cube", cube_shape, slab, cube.data());
}

// Reads the test tensors back with `comm` in decompositions unlike the
// writer's, and compares every element with its closed form.
void check_tensors(const CheckpointReader& rd, const comm::Communicator& comm) {
  const int r = comm.rank(), p = comm.size();
  EXPECT_EQ(rd.shape("/model/wte"), matrix_shape);
  EXPECT_EQ(rd.shape("model/ln_f/gamma"), vector_shape); // a relative path names the same
  EXPECT_EQ(rd.shape("/model/layers/0/attn/wq"), replica_shape);
  EXPECT_EQ(rd.shape("/optimizer/m/cube"), cube_shape);

  // The matrix by columns, then whole on every rank.
  const auto [c0, c1] = even(matrix_shape[1], r, p);
  const Block cols{{0, c0}, {matrix_shape[0], c1 - c0}};
  std::vector<float> got(cols.size(), -1.0f);
  rd.read("/model/wte", cols, got.data());
  EXPECT_EQ(got, fill2(cols, matrix_value)) << "columns [" << c0 << ", " << c1 << ")";
  const Block all = Block::whole(matrix_shape);
  got.assign(all.size(), -1.0f);
  rd.read("/model/wte", all, got.data());
  for (std::uint64_t i = 0; i < 7; ++i)
    for (std::uint64_t j = 0; j < 5; ++j)
      EXPECT_EQ(got[i * 5 + j], 100.0f * i + j) << "(" << i << ", " << j << ")";

  // The vector: one element per rank, then whole.
  float one = -1.0f;
  const std::uint64_t k = static_cast<std::uint64_t>(r) % 13;
  rd.read("/model/ln_f/gamma", Block{{k}, {1}}, &one);
  EXPECT_EQ(one, 0.5f * k - 3.0f);
  got.assign(13, -1.0f);
  rd.read("/model/ln_f/gamma", Block::whole(vector_shape), got.data());
  for (std::uint64_t i = 0; i < 13; ++i)
    EXPECT_EQ(got[i], 0.5f * i - 3.0f) << i;

  // The replicated tensor: ranks other than 0 read it, rank 0 reads nothing.
  got.assign(12, -1.0f);
  rd.read("/model/layers/0/attn/wq", r == 0 ? Block::none() : Block::whole(replica_shape),
          got.data());
  if (r != 0)
    for (std::uint64_t i = 0; i < 12; ++i)
      EXPECT_EQ(got[i], static_cast<float>(i) + 0.25f) << i;

  // The 3-D tensor: a [1, 2, 2] block that moves with the rank.
  const std::uint64_t c = static_cast<std::uint64_t>(r) % 3;
  got.assign(4, -1.0f);
  rd.read("/optimizer/m/cube", Block{{1, 1, c}, {1, 2, 2}}, got.data());
  EXPECT_EQ(got,
            (std::vector<float>{-(1100.0f + c), -(1101.0f + c), -(1200.0f + c), -(1201.0f + c)}));
}

// Writes `text` to `path` on rank 0; the others wait until it is there.
void put_file(const comm::Communicator& comm, const std::string& path, const std::string& text) {
  if (comm.rank() == 0)
    std::ofstream(path, std::ios::binary) << text;
  MPI_Barrier(comm.raw());
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

} // namespace

TEST(Checkpoint, TensorsComeBackInAnotherDecomposition) {
  const auto world = comm::Communicator::world();
  TempPath file(world);
  {
    CheckpointWriter w(file.str(), world);
    write_tensors(w, world);
    w.close();
  }
  CheckpointReader rd(file.str(), world);
  EXPECT_TRUE(rd.has("/model/wte"));
  EXPECT_TRUE(rd.has("/model/layers/0/attn/wq"));
  EXPECT_FALSE(rd.has("/model/layers/0/attn")) << "a group is not a dataset";
  EXPECT_FALSE(rd.has("/model/wpe"));
  EXPECT_FALSE(rd.has("/model/layers/1/attn/wq"));
  check_tensors(rd, world);
}

TEST(Checkpoint, ReshardsAcrossRankCounts) {
  const auto world = comm::Communicator::world();
  const int p = world.size();
  // Written by rank 0 alone, read by all ranks.
  {
    TempPath file(world, "_from_one");
    const auto alone = world.split(world.rank() == 0 ? 0 : 1, 0);
    if (world.rank() == 0) {
      CheckpointWriter w(file.str(), alone);
      write_tensors(w, alone);
      w.close();
    }
    MPI_Barrier(world.raw());
    CheckpointReader rd(file.str(), world);
    check_tensors(rd, world);
  }
  // Written by all ranks, read by the last rank alone and by the lower half.
  {
    TempPath file(world, "_to_fewer");
    {
      CheckpointWriter w(file.str(), world);
      write_tensors(w, world);
      w.close();
    }
    const auto last = world.split(world.rank() == p - 1 ? 0 : 1, 0);
    if (world.rank() == p - 1) {
      CheckpointReader rd(file.str(), last);
      check_tensors(rd, last);
    }
    const auto half = world.split(world.rank() < (p + 1) / 2 ? 0 : 1, 0);
    if (world.rank() < (p + 1) / 2) {
      CheckpointReader rd(file.str(), half);
      check_tensors(rd, half);
    }
    MPI_Barrier(world.raw());
  }
}

TEST(Checkpoint, AttributesRoundTrip) {
  const auto world = comm::Communicator::world();
  TempPath file(world);
  // A deck with newlines, quotes and non-ASCII text, longer than the 64 KiB an
  // object header can hold, so "any length" is tested.
  std::string deck = "# cubelm deck, \"quoted\", caf\xc3\xa9\n[model]\nhidden = 64\n";
  while (deck.size() < 70000)
    deck += "# padding line " + std::to_string(deck.size()) + "\n";
  const std::int64_t tokens = std::int64_t{1} << 40;
  {
    CheckpointWriter w(file.str(), world);
    w.write("/model/wte", {2}, world.rank() == 0 ? Block::whole({2}) : Block::none(),
            std::vector<float>{1, 2}.data());
    w.set_attribute("/", "version", std::int64_t{1});
    w.set_attribute("/", "step", 999);  // replaced below
    w.set_attribute("/", "step", 1234); // an int, through the integer overload
    w.set_attribute("/", "tokens_seen", tokens);
    w.set_attribute("/", "deck", deck);
    w.set_attribute("/", "layout", "tp=3d:8 pp=1 dp=1");
    w.set_attribute("/", "seed", std::int64_t{-42});
    w.set_attribute("/", "data_cursor", std::int64_t{9876543210});
    w.set_attribute("/", "empty", std::string());
    w.set_attribute("/", "lr", 6e-4);
    w.set_attribute("/optimizer", "step", std::int64_t{1234}); // creates the group
    w.set_attribute("/optimizer", "beta2", 0.95);
    w.set_attribute("/model", "note", "on a group made by write()");
    w.set_attribute("/model/wte", "tiny", 1e-300); // on a dataset
    w.close();
  }
  CheckpointReader rd(file.str(), world);
  EXPECT_EQ(rd.string_attribute("/", "format"), "cubelm-checkpoint");
  EXPECT_EQ(rd.int_attribute("/", "version"), 1);
  EXPECT_EQ(rd.int_attribute("/", "step"), 1234);
  EXPECT_EQ(rd.int_attribute("/", "tokens_seen"), 1099511627776);
  EXPECT_EQ(rd.string_attribute("/", "deck"), deck);
  EXPECT_EQ(rd.string_attribute("/", "layout"), "tp=3d:8 pp=1 dp=1");
  EXPECT_EQ(rd.int_attribute("/", "seed"), -42);
  EXPECT_EQ(rd.int_attribute("/", "data_cursor"), 9876543210);
  EXPECT_EQ(rd.string_attribute("/", "empty"), "");
  EXPECT_EQ(rd.double_attribute("/", "lr"), 6e-4);
  EXPECT_EQ(rd.int_attribute("/optimizer", "step"), 1234);
  EXPECT_EQ(rd.double_attribute("optimizer/", "beta2"), 0.95);
  EXPECT_EQ(rd.double_attribute("/", "version"), 1.0) << "an integer reads as a double";
  EXPECT_EQ(rd.string_attribute("/model", "note"), "on a group made by write()");
  EXPECT_EQ(rd.double_attribute("/model/wte", "tiny"), 1e-300);
  EXPECT_TRUE(rd.has_attribute("/", "deck"));
  EXPECT_FALSE(rd.has_attribute("/", "missing"));
  EXPECT_FALSE(rd.has_attribute("/nowhere", "step"));
  EXPECT_FALSE(rd.has("/optimizer")) << "a group made by set_attribute is not a dataset";
}

TEST(Checkpoint, FinalNameAppearsOnlyAtClose) {
  const auto world = comm::Communicator::world();
  TempPath file(world);
  const std::string partial = CheckpointWriter::partial_path(file.str());
  EXPECT_EQ(partial, file.str() + ".partial");
  put_file(world, file.str(), "the previous checkpoint");
  {
    CheckpointWriter w(file.str(), world);
    MPI_Barrier(world.raw());
    EXPECT_TRUE(fs::exists(partial));
    EXPECT_EQ(file_text(file.str()), "the previous checkpoint") << "replaced before close()";
    w.write("/x", {4}, world.rank() == 0 ? Block::whole({4}) : Block::none(),
            std::vector<float>{1, 2, 3, 4}.data());
    MPI_Barrier(world.raw());
    EXPECT_EQ(file_text(file.str()), "the previous checkpoint") << "replaced before close()";
    w.close();
    EXPECT_FALSE(fs::exists(partial)) << "close() renames the partial file";
    EXPECT_TRUE(fs::exists(file.str()));
  }
  CheckpointReader rd(file.str(), world);
  std::vector<float> got(4);
  rd.read("/x", Block::whole({4}), got.data());
  EXPECT_EQ(got, (std::vector<float>{1, 2, 3, 4}));

  // A writer abandoned without close() (an exception on every rank) leaves
  // the final name alone.
  TempPath other(world, "_abandoned");
  {
    CheckpointWriter w(other.str(), world);
    w.write("/x", {4}, world.rank() == 0 ? Block::whole({4}) : Block::none(),
            std::vector<float>{1, 2, 3, 4}.data());
  }
  MPI_Barrier(world.raw());
  EXPECT_FALSE(fs::exists(other.str()));
  EXPECT_TRUE(fs::exists(CheckpointWriter::partial_path(other.str())));
}

TEST(Checkpoint, UnusableFilesAreErrorsOnEveryRank) {
  const auto world = comm::Communicator::world();
  TempPath file(world);
  const std::string& path = file.str();

  std::string msg = error_of([&] { CheckpointReader(path, world); });
  EXPECT_HAS(msg, "checkpoint " + path + ": no such file");

  put_file(world, path, "these bytes are not HDF5\n");
  msg = error_of([&] { CheckpointReader(path, world); });
  EXPECT_HAS(msg, "checkpoint " + path + ": not an HDF5 file");

  // HDF5 written by someone else: no format attribute, then a wrong one.
  if (world.rank() == 0) {
    const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(f, 0);
    H5Fclose(f);
  }
  MPI_Barrier(world.raw());
  msg = error_of([&] { CheckpointReader(path, world); });
  EXPECT_HAS(msg, "checkpoint " + path + ": no root attribute format");
  EXPECT_HAS(msg, "cubelm-checkpoint");

  if (world.rank() == 0) {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, 9); // fixed length, as other tools write it
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(f, "format", type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, type, "other-fmt");
    H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
    H5Fclose(f);
  }
  MPI_Barrier(world.raw());
  msg = error_of([&] { CheckpointReader(path, world); });
  EXPECT_HAS(msg, "checkpoint " + path + ": root attribute format = \"other-fmt\"");

  // A cubelm file whose global heap (where the variable-length format string
  // lives) is damaged: an Error naming the file, not an abort. Every signature is
  // overwritten: a collective metadata write may leave a stale copy of the heap that
  // the file does not use.
  {
    CheckpointWriter w(path, world);
    w.close();
  }
  if (world.rank() == 0) {
    const std::string bytes = file_text(path);
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    int heaps = 0;
    for (auto at = bytes.find("GCOL"); at != std::string::npos; at = bytes.find("GCOL", at + 4)) {
      io.seekp(static_cast<std::streamoff>(at));
      io.write("XXXX", 4);
      ++heaps;
    }
    io.close();
    EXPECT_GT(heaps, 0) << "no global heap collection in " << path;
    EXPECT_EQ(file_text(path).find("GCOL"), std::string::npos);
  }
  MPI_Barrier(world.raw());
  msg = error_of([&] { CheckpointReader(path, world); });
  EXPECT_HAS(msg, "checkpoint " + path + ": damaged: HDF5 cannot read it");

  const std::string dir = fs::temp_directory_path().string();
  msg = error_of([&] { CheckpointReader(dir, world); });
  EXPECT_HAS(msg, "checkpoint " + dir + ": is a directory");

  const std::string nowhere = path + ".missing-dir/ckpt.h5";
  msg = error_of([&] { CheckpointWriter(nowhere, world); });
  EXPECT_HAS(msg, "checkpoint " + nowhere + ": the directory " + path + ".missing-dir");
}

TEST(Checkpoint, MissingDatasetsAndAttributesAreErrors) {
  const auto world = comm::Communicator::world();
  TempPath file(world);
  const std::string& path = file.str();
  {
    CheckpointWriter w(path, world);
    w.write("/model/wte", {2, 3}, world.rank() == 0 ? Block::whole({2, 3}) : Block::none(),
            std::vector<float>(6, 1.0f).data());
    w.set_attribute("/", "step", std::int64_t{7});
    w.set_attribute("/", "layout", "tp=1d:2");
    w.close();
  }
  CheckpointReader rd(path, world);
  std::string msg = error_of([&] { rd.shape("/model/wpe"); });
  EXPECT_HAS(msg, "checkpoint " + path + ": no dataset /model/wpe");
  msg = error_of([&] { rd.shape("/model/layers/3/attn/wq"); });
  EXPECT_HAS(msg, "no dataset /model/layers/3/attn/wq (there is no /model/layers)");
  msg = error_of([&] { rd.shape("/model"); });
  EXPECT_HAS(msg, "/model is a group, not a dataset");
  float out[6];
  msg = error_of([&] { rd.read("/model/wpe", Block::whole({2, 3}), out); });
  EXPECT_HAS(msg, "checkpoint " + path + ": no dataset /model/wpe");

  msg = error_of([&] { rd.string_attribute("/", "deck"); });
  EXPECT_HAS(msg, "checkpoint " + path + ": / has no attribute deck");
  msg = error_of([&] { rd.int_attribute("/optimizer", "step"); });
  EXPECT_HAS(msg, "checkpoint " + path + ": no /optimizer (looking for its attribute step)");
  msg = error_of([&] { rd.int_attribute("/", "layout"); });
  EXPECT_HAS(msg, "checkpoint " + path + ": attribute layout of / is a string, not an integer");
  msg = error_of([&] { rd.string_attribute("/", "step"); });
  EXPECT_HAS(msg, "attribute step of / is an integer, not a string");
  msg = error_of([&] { rd.double_attribute("/", "layout"); });
  EXPECT_HAS(msg, "attribute layout of / is a string, not a floating-point number");

  msg = error_of([] { check_shape("x.h5", "/model/wte", {256, 64}, {512, 64}); });
  EXPECT_EQ(msg, "checkpoint x.h5: /model/wte has shape [256, 64], the deck needs [512, 64]");
  msg = error_of([&] { rd.expect_shape("/model/wte", {2, 3, 1}); });
  EXPECT_EQ(msg, "checkpoint " + path + ": /model/wte has shape [2, 3], the deck needs [2, 3, 1]");
  EXPECT_NO_THROW(rd.expect_shape("/model/wte", {2, 3}));
  EXPECT_NO_THROW(check_shape("x.h5", "/b", {4}, {4}));
}

TEST(Checkpoint, BadBlocksAreErrorsOnEveryRank) {
  const auto world = comm::Communicator::world();
  const int r = world.rank(), p = world.size();
  TempPath file(world);
  const Shape shape{3, 4};
  const std::vector<float> data = fill2(Block::whole(shape), replica_value);
  const Block mine = r == 0 ? Block::whole(shape) : Block::none();
  for (const Writers writers : {Writers::one, Writers::all}) {
    SCOPED_TRACE(writers == Writers::one ? "one writer" : "all ranks");
    CheckpointWriter w(file.str(), world, writers);
    // Nobody writes: a gap. Everyone writes (p > 1): overlapping replicas.
    std::string msg = internal_error_of([&] { w.write("/t", shape, Block::none(), nullptr); });
    EXPECT_HAS(msg, "/t: the blocks of all ranks hold 0 elements, the tensor [3, 4] has 12");
    if (p > 1) {
      msg = internal_error_of([&] { w.write("/t", shape, Block::whole(shape), data.data()); });
      EXPECT_HAS(msg, "hold " + std::to_string(12 * p) + " elements");
    }
    // Only the last rank is wrong; every rank hears of it.
    const Block past = r == p - 1 ? Block{{2, 0}, {2, 4}} : Block::none();
    msg = internal_error_of([&] { w.write("/t", shape, past, data.data()); });
    EXPECT_HAS(msg, "rank " + std::to_string(p - 1) + ": block offset [2, 0] count [2, 4]");
    EXPECT_HAS(msg, "reaches past the end of dimension 0");
    // The writer is still usable after refusing.
    w.write("/t", shape, mine, data.data());
    msg = internal_error_of([&] { w.write("/t", shape, mine, data.data()); });
    EXPECT_HAS(msg, "/t: written twice");
    msg = internal_error_of([&] { w.write("/t/under", {1}, Block::none(), nullptr); });
    EXPECT_HAS(msg, "/t is a dataset, not a group");
    // What every rank sent for a refused tensor went nowhere: every rank's rows of the next
    // one arrive whole.
    const auto [u0, u1] = even(shape[0], r, p);
    w.write("/u", shape, Block::rows(shape, u0, u1), data.data() + u0 * shape[1]);
    w.close();
    EXPECT_EQ(read_whole(file.str(), world, "/u", shape), data);
  }
  CheckpointReader rd(file.str(), world);
  std::vector<float> got(12, -1.0f);
  const Block bad = r == p - 1 ? Block{{0, 3}, {3, 2}} : Block::whole(shape);
  std::string msg = error_of([&] { rd.read("/t", bad, got.data()); });
  EXPECT_HAS(msg, "checkpoint " + file.str() + ": /t: rank " + std::to_string(p - 1) +
                      " asked for block offset [0, 3] count [3, 2]");
  msg = error_of([&] { rd.read("/t", Block{{0}, {3}}, got.data()); });
  EXPECT_HAS(msg, "the block needs 2 offsets and counts");
  // No rank is left behind: a good read right after works everywhere.
  rd.read("/t", Block::whole(shape), got.data());
  EXPECT_EQ(got, data);
}

TEST(Checkpoint, H5dumpReadsTheFile) {
  const auto world = comm::Communicator::world();
  // CUBELM_H5DUMP names another program (or a missing one, to see this skip).
  const char* env = std::getenv("CUBELM_H5DUMP");
  const std::string h5dump = env && *env ? env : "h5dump";
  int have = 0;
  if (world.rank() == 0)
    have = std::system(("command -v '" + h5dump + "' > /dev/null 2>&1").c_str()) == 0;
  MPI_Bcast(&have, 1, MPI_INT, 0, world.raw());
  // scripts/setup installs it (hdf5-tools); every HDF5 installation has it.
  ASSERT_TRUE(have) << h5dump << " not found: install HDF5's tools (package hdf5-tools)";
  TempPath file(world);
  {
    CheckpointWriter w(file.str(), world);
    write_tensors(w, world);
    w.set_attribute("/", "layout", "tp=3d:8 pp=1 dp=1");
    w.set_attribute("/", "step", std::int64_t{1234});
    w.close();
  }
  if (world.rank() != 0)
    return;
  const auto run = [](const std::string& command) {
    std::string out;
    if (FILE* pipe = popen(command.c_str(), "r")) {
      char buf[4096];
      for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;)
        out.append(buf, n);
      EXPECT_EQ(pclose(pipe), 0) << command << "\n" << out;
    }
    return out;
  };
  const std::string header = run(h5dump + " -H '" + file.str() + "' 2>&1");
  EXPECT_HAS(header, "DATASET \"wte\"");
  EXPECT_HAS(header, "DATASPACE  SIMPLE { ( 7, 5 ) / ( 7, 5 ) }");
  EXPECT_HAS(header, "DATASPACE  SIMPLE { ( 13 ) / ( 13 ) }");
  EXPECT_HAS(header, "DATASPACE  SIMPLE { ( 3, 4 ) / ( 3, 4 ) }");
  EXPECT_HAS(header, "DATASPACE  SIMPLE { ( 2, 3, 4 ) / ( 2, 3, 4 ) }");
  EXPECT_HAS(header, "H5T_IEEE_F32LE");
  EXPECT_HAS(header, "CSET H5T_CSET_UTF8");
  // The stored order is row-major over the global shape, whatever wrote it.
  const std::string data = run(h5dump + " -d /model/wte '" + file.str() + "' 2>&1");
  EXPECT_HAS(data, "(0,0): 0, 1, 2, 3, 4,");
  EXPECT_HAS(data, "(6,0): 600, 601, 602, 603, 604");
  const std::string attrs = run(h5dump + " -a /layout -a /format '" + file.str() + "' 2>&1");
  EXPECT_HAS(attrs, "\"tp=3d:8 pp=1 dp=1\"");
  EXPECT_HAS(attrs, "\"cubelm-checkpoint\"");
}

// Chunks spread a tensor's rows evenly (HDF5 allocates every chunk whole, so a last chunk
// of a few rows would be mostly padding), and checkpoint_file_bytes is the file's size.
TEST(Checkpoint, ChunksSpreadTheRowsAndTheFileIsTheSizePredicted) {
  const auto world = comm::Communicator::world();
  TempPath file(world);
  // [768, 3072] takes three chunks: 256 rows each (not 341, 341 and 86 of 341 allocated);
  // [3, 700000] takes three of one row; [5000, 7] one.
  const std::vector<std::vector<std::uint64_t>> shapes = {{768, 3072}, {3, 700000}, {5000, 7}};
  {
    CheckpointWriter w(file.str(), world);
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const std::uint64_t rows = shapes[t][0];
      const auto r = static_cast<std::uint64_t>(world.rank()),
                 p = static_cast<std::uint64_t>(world.size());
      const Block block = Block::rows(shapes[t], rows * r / p, rows * (r + 1) / p);
      const std::vector<float> data(static_cast<std::size_t>(block.size()), 1.5f);
      w.write("/t" + std::to_string(t), shapes[t], block, data.data());
    }
    w.close();
  }
  if (world.rank() != 0)
    return;
  const hid_t f = H5Fopen(file.str().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const std::uint64_t chunks[] = {3, 3, 1};
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const hid_t d = H5Dopen2(f, ("/t" + std::to_string(t)).c_str(), H5P_DEFAULT);
    const std::uint64_t logical = 4 * shapes[t][0] * shapes[t][1];
    // The data and a 4-byte checksum per chunk: no padding rows.
    EXPECT_EQ(H5Dget_storage_size(d), logical + 4 * chunks[t]) << "tensor " << t;
    H5Dclose(d);
  }
  H5Fclose(f);
  const double size = static_cast<double>(fs::file_size(file.str()));
  const double predicted = static_cast<double>(checkpoint_file_bytes(shapes));
  EXPECT_NEAR(size, predicted, 0.01 * predicted) << "file " << size << " predicted " << predicted;
}

// checkpoint.writers = "one": the first rank writes the file, the others send it their
// blocks. The tensors come back as written, in any decomposition, and every chunk's
// checksum holds.
TEST(Checkpoint, OneWriterWritesWhatEveryRankHolds) {
  const auto world = comm::Communicator::world();
  TempPath file(world);
  {
    CheckpointWriter w(file.str(), world, Writers::one);
    write_tensors(w, world);
    w.set_attribute("/", "step", std::int64_t{17});
    w.close();
  }
  EXPECT_FALSE(fs::exists(CheckpointWriter::partial_path(file.str())));
  CheckpointReader rd(file.str(), world);
  check_tensors(rd, world);
  EXPECT_EQ(rd.int_attribute("/", "step"), 17);
  const Verification v = verify_checkpoint(file.str(), world);
  EXPECT_EQ(v.problem, "");
  EXPECT_EQ(v.datasets, 4);
  EXPECT_TRUE(v.checksums);
}

// A tensor of three chunks of 700 rows (the last one a row short, which HDF5 stores padded),
// written under Writers::one in slabs of one chunk (the test hook), by blocks of rows and
// columns whose edges cross the slabs': each rank sends the first rank its rows of each
// slab, which places them by column. And in one slab of three chunks, the second and third
// of which do not start on a 4 KiB boundary in the slab, so that the driver's thread copies
// them before it writes them.
TEST(Checkpoint, OneWriterAssemblesSlabsFromBlocksOfRowsAndColumns) {
  const auto world = comm::Communicator::world();
  const int r = world.rank(), p = world.size();
  const Shape shape{2099, 1000};
  // Two row bands (split at row 1000, inside the second slab) by p / 2 column bands.
  const int row_bands = p > 1 ? 2 : 1, col_bands = p / row_bands;
  const std::uint64_t row_edge[] = {0, row_bands > 1 ? 1000 : shape[0], shape[0]};
  const int band = r / col_bands, col = r % col_bands;
  const auto [c0, c1] = even(shape[1], col, col_bands);
  const Block block{{row_edge[band], c0}, {row_edge[band + 1] - row_edge[band], c1 - c0}};
  std::vector<float> mine;
  for (std::uint64_t i = 0; i < block.count[0]; ++i)
    for (std::uint64_t j = 0; j < block.count[1]; ++j)
      mine.push_back(wide_value(block.offset[0] + i, block.offset[1] + j));
  for (const bool one_chunk_slabs : {true, false}) {
    SCOPED_TRACE(one_chunk_slabs ? "slabs of one chunk" : "one slab of three chunks");
    TempPath file(world);
    if (one_chunk_slabs)
      ASSERT_EQ(setenv("CUBELM_TEST_SLAB_ELEMENTS", "1", 1), 0);
    {
      CheckpointWriter w(file.str(), world, Writers::one);
      w.write("/model/wte", shape, block, mine.data());
      // A tensor of one slab after it, with the same messages' tag.
      const Block rows = Block::rows(matrix_shape, uneven(7, r, p).first, uneven(7, r, p).second);
      const std::vector<float> few = fill2(rows, matrix_value);
      w.write("/model/wpe", matrix_shape, rows, few.data());
      // A chunk of 64 KiB with its checksum, 4 bytes short of 64 KiB without: the checksum
      // ends the chunk's last whole block, which the driver copies rather than borrows
      // (the writer puts back the element the checksum borrowed as soon as HDF5 returns).
      const auto [v0, v1] = uneven(kBlockChunk[0], r, p);
      const std::vector<float> line = fill1(Block{{v0}, {v1 - v0}});
      w.write("/model/line", kBlockChunk, Block{{v0}, {v1 - v0}}, line.data());
      w.close();
    }
    ASSERT_EQ(unsetenv("CUBELM_TEST_SLAB_ELEMENTS"), 0);
    EXPECT_EQ(wrong_wide_elements(read_whole(file.str(), world, "/model/wte", shape), shape), 0);
    CheckpointReader rd(file.str(), world);
    std::vector<float> small(35);
    rd.read("/model/wpe", Block::whole(matrix_shape), small.data());
    EXPECT_EQ(small, fill2(Block::whole(matrix_shape), matrix_value));
    std::vector<float> line(kBlockChunk[0]);
    rd.read("/model/line", Block::whole(kBlockChunk), line.data());
    EXPECT_EQ(line, fill1(Block::whole(kBlockChunk)));
    EXPECT_EQ(verify_checkpoint(file.str(), world).problem, "");
  }
}

// Block::run: the blocks of a run of a block's elements hold exactly those elements, in
// their row-major order, in at most 2 d - 1 blocks: every run of blocks of 1, 2 and 3
// dimensions, against the elements counted one by one.
TEST(Checkpoint, RunsOfABlockAreBlocksInItsOrder) {
  const std::vector<Block> blocks = {Block{{2}, {5}}, Block{{1, 3}, {3, 4}},
                                     Block{{0, 1, 2}, {3, 2, 4}}, Block{{4, 0}, {1, 6}}};
  for (const Block& block : blocks) {
    const std::size_t nd = block.count.size();
    // Element k of the block (row-major) as global coordinates.
    const auto element = [&](std::uint64_t k) {
      std::vector<std::uint64_t> at(nd);
      for (std::size_t d = nd; d-- > 0;) {
        at[d] = block.offset[d] + k % block.count[d];
        k /= block.count[d];
      }
      return at;
    };
    const std::uint64_t n = block.size();
    for (std::uint64_t first = 0; first <= n; ++first)
      for (std::uint64_t count = 0; first + count <= n; ++count) {
        std::vector<std::vector<std::uint64_t>> got;
        const std::vector<Block> run = block.run(first, count);
        EXPECT_LE(run.size(), 2 * nd - 1);
        for (const Block& b : run) {
          EXPECT_FALSE(b.empty());
          for (std::uint64_t k = 0; k < b.size(); ++k) {
            std::vector<std::uint64_t> at(nd);
            std::uint64_t rest = k;
            for (std::size_t d = nd; d-- > 0;) {
              at[d] = b.offset[d] + rest % b.count[d];
              rest /= b.count[d];
            }
            got.push_back(at);
          }
        }
        std::vector<std::vector<std::uint64_t>> want;
        for (std::uint64_t k = first; k < first + count; ++k)
          want.push_back(element(k));
        ASSERT_EQ(got, want) << "block " << shape_text(block.offset) << " + "
                             << shape_text(block.count) << ", run [" << first << ", "
                             << first + count << ")";
      }
  }
}

// Ranks that share a block write runs of it (ZeRO's shards of a parameter's moments):
// blocks of columns (and of whole rows on one rank), each cut into uneven runs whose edges
// cross rows, chunks and the one writer's slabs (one chunk each, the test hook), under
// both writers; the tensors read back whole.
TEST(Checkpoint, RanksWriteRunsOfTheirBlocks) {
  const auto world = comm::Communicator::world();
  const int r = world.rank(), p = world.size();
  const Shape shape{2099, 1000};
  const Shape cube{6, 5, 7};
  // Two column bands (one on a single rank); the ranks of a band share its block in runs.
  const int bands = p > 1 ? 2 : 1, band = r % bands, sharing = (p - band + bands - 1) / bands,
            share = r / bands;
  const auto [c0, c1] = even(shape[1], band, bands);
  const Block block{{0, c0}, {shape[0], c1 - c0}};
  const auto [k0, k1] = uneven(block.size(), share, sharing);
  std::vector<float> part;
  for (std::uint64_t k = k0; k < k1; ++k)
    part.push_back(wide_value(k / block.count[1], c0 + k % block.count[1]));
  // The cube: one block of all of it, in runs.
  const auto [q0, q1] = uneven(210, r, p);
  std::vector<float> cube_part;
  for (std::uint64_t k = q0; k < q1; ++k)
    cube_part.push_back(cube_value(k / 35, k / 7 % 5, k % 7));
  for (const Writers writers : {Writers::all, Writers::one}) {
    SCOPED_TRACE(writers == Writers::one ? "one writer" : "all ranks");
    TempPath file(world);
    ASSERT_EQ(setenv("CUBELM_TEST_SLAB_ELEMENTS", "1", 1), 0);
    {
      CheckpointWriter w(file.str(), world, writers);
      w.write("/model/wte", shape, block, k0, k1 - k0, part.data());
      w.write("/model/cube", cube, Block::whole(cube), q0, q1 - q0, cube_part.data());
      w.close();
    }
    ASSERT_EQ(unsetenv("CUBELM_TEST_SLAB_ELEMENTS"), 0);
    EXPECT_EQ(wrong_wide_elements(read_whole(file.str(), world, "/model/wte", shape), shape), 0);
    CheckpointReader rd(file.str(), world);
    std::vector<float> whole(210);
    rd.read("/model/cube", Block::whole(cube), whole.data());
    for (std::uint64_t k = 0; k < 210; ++k)
      EXPECT_EQ(whole[k], cube_value(k / 35, k / 7 % 5, k % 7)) << k;
    EXPECT_EQ(verify_checkpoint(file.str(), world).problem, "");
  }
  // Runs that do not tile the tensor, or reach past their block: errors on every rank.
  TempPath file(world);
  CheckpointWriter w(file.str(), world, Writers::one);
  std::string msg = internal_error_of([&] {
    w.write("/t", cube, Block::whole(cube), q0, q1 > q0 ? q1 - q0 - 1 : 0, cube_part.data());
  });
  EXPECT_HAS(msg, "/t: the blocks of all ranks hold 20");
  msg = internal_error_of([&] {
    w.write("/t", cube, Block{{0, 0, 0}, {1, 5, 7}}, r == p - 1 ? 30 : 0, r == p - 1 ? 6 : 0,
            cube_part.data());
  });
  EXPECT_HAS(msg, "rank " + std::to_string(p - 1) + ": elements [30, 36) of a block of 35");
}

// The tensor of the one writer's driver tests: 8 MiB, two chunks of 4 MiB, and this
// rank's block of rows of it.
namespace {
const Shape kEightMiB{2048, 1024};
Block rows_of_eight_mib(const comm::Communicator& world) {
  const auto [r0, r1] = even(kEightMiB[0], world.rank(), world.size());
  return Block::rows(kEightMiB, r0, r1);
}
// This rank's `block` of tensor `name` of the checkpoint at `path`.
std::vector<float> read_back(const std::string& path, const comm::Communicator& world,
                             const std::string& name, const Block& block) {
  CheckpointReader rd(path, world);
  std::vector<float> back(static_cast<std::size_t>(block.size()));
  rd.read(name, block, back.data());
  return back;
}
} // namespace

// The one writer's chunks go to storage directly (O_DIRECT) where the file system allows
// it: after a save, few of the file's pages are in the page cache (the metadata and each
// chunk's last partial block are).
TEST(Checkpoint, OneWriterWritesChunksPastThePageCache) {
  const auto world = comm::Communicator::world();
  const int r = world.rank();
  const Shape& shape = kEightMiB;
  const Block rows = rows_of_eight_mib(world);
  const std::vector<float> mine(static_cast<std::size_t>(rows.size()), 2.5f);
  TempPath file(world);
  {
    CheckpointWriter w(file.str(), world, Writers::one);
    w.write("/model/a", shape, rows, mine.data());
    w.write("/model/b", shape, rows, mine.data());
    w.close();
  }
  if (r == 0) {
    // Does this file system take O_DIRECT writes at all?
    const std::string probe = file.str() + ".probe";
    const int pfd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_DIRECT, 0644);
    void* block = nullptr;
    ASSERT_EQ(posix_memalign(&block, 4096, 4096), 0);
    std::memset(block, 0, 4096);
    const bool direct = pfd >= 0 && ::pwrite(pfd, block, 4096, 0) == 4096;
    std::free(block);
    if (pfd >= 0)
      ::close(pfd);
    std::remove(probe.c_str());
    const int fd = ::open(file.str().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    const auto bytes = static_cast<std::size_t>(fs::file_size(file.str()));
    void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT_NE(map, MAP_FAILED);
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> resident((bytes + page - 1) / page);
    ASSERT_EQ(::mincore(map, bytes, resident.data()), 0);
    ::munmap(map, bytes);
    ::close(fd);
    std::size_t cached = 0;
    for (const unsigned char in : resident)
      cached += in & 1;
    if (!direct)
      GTEST_SKIP() << "this file system refuses O_DIRECT writes: the driver writes through "
                      "the page cache ("
                   << cached << " of " << resident.size() << " pages cached)";
    EXPECT_LT(cached, resident.size() / 10)
        << cached << " of the file's " << resident.size() << " pages are in the page cache";
  }
  EXPECT_EQ(read_back(file.str(), world, "/model/b", rows), mine);
}

// An HDF5 that refuses cubelm's file driver (its driver interface changed): the one writer
// says so once and writes the same file through HDF5's POSIX driver.
TEST(Checkpoint, OneWriterFallsBackToHdf5sDriverWhereTheDriverIsRefused) {
  const auto world = comm::Communicator::world();
  const int r = world.rank();
  const Shape& shape = kEightMiB;
  const Block rows = rows_of_eight_mib(world);
  const std::vector<float> mine = fill2(rows, matrix_value);
  TempPath file(world);
  ::setenv("CUBELM_TEST_REFUSE_DRIVER", "1", 1);
  ::testing::internal::CaptureStderr();
  {
    CheckpointWriter w(file.str(), world, Writers::one);
    w.write("/model/a", shape, rows, mine.data());
    w.close();
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  ::unsetenv("CUBELM_TEST_REFUSE_DRIVER");
  if (r == 0) {
    EXPECT_NE(said.find("cubelm: warning: HDF5 "), std::string::npos) << said;
    EXPECT_NE(said.find("refused cubelm's checkpoint file driver (refused for a test"),
              std::string::npos)
        << said;
  }
  EXPECT_EQ(read_back(file.str(), world, "/model/a", rows), mine);
}

// A chunk the one writer cannot write (here: past the first rank's file size limit) ends
// the save with a cubelm::Error on every rank that names the file and the system's error,
// at the next tensor or at close(); the file keeps its .partial name. The limit lifted,
// the same ranks write the next checkpoint.
TEST(Checkpoint, OneWriterThatCannotWriteFailsOnEveryRank) {
  const auto world = comm::Communicator::world();
  const int r = world.rank();
  const Shape& shape = kEightMiB;
  const Block rows = rows_of_eight_mib(world);
  const std::vector<float> mine(static_cast<std::size_t>(rows.size()), 2.5f);
  TempPath file(world);
  rlimit before{};
  void (*handler)(int) = SIG_DFL;
  if (r == 0) {
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
    rlimit small = before;
    small.rlim_cur = 1 << 20;
    handler = std::signal(SIGXFSZ, SIG_IGN); // the write fails with EFBIG instead
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  }
  const std::string message = error_of([&] {
    CheckpointWriter w(file.str(), world, Writers::one);
    for (const char* name : {"/model/a", "/model/b", "/model/c"})
      w.write(name, shape, rows, mine.data());
    w.close();
  });
  if (r == 0) {
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
    std::signal(SIGXFSZ, handler);
  }
  EXPECT_HAS(message, "checkpoint " + file.str() + ": cannot write ");
  EXPECT_HAS(message, CheckpointWriter::partial_path(file.str()) + ": " + std::strerror(EFBIG));
  if (r == 0) {
    EXPECT_FALSE(fs::exists(file.str()));
    EXPECT_TRUE(fs::exists(CheckpointWriter::partial_path(file.str())));
  }
  {
    CheckpointWriter w(file.str(), world, Writers::one);
    w.write("/model/a", shape, rows, mine.data());
    w.close();
  }
  EXPECT_EQ(verify_checkpoint(file.str(), world).problem, "");
}

// HDF5's Fletcher32 as its filter computes it, word by word, folding every 360 words.
std::uint32_t hdf5_fletcher32(const std::vector<std::uint8_t>& bytes) {
  std::uint32_t sum1 = 0, sum2 = 0;
  std::size_t words = bytes.size() / 2, at = 0;
  while (words > 0) {
    std::size_t n = std::min<std::size_t>(words, 360);
    words -= n;
    for (; n > 0; --n, at += 2) {
      sum1 += (std::uint32_t(bytes[at]) << 8) | bytes[at + 1];
      sum2 += sum1;
    }
    sum1 = (sum1 & 0xffff) + (sum1 >> 16);
    sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  }
  sum1 = (sum1 & 0xffff) + (sum1 >> 16);
  sum2 = (sum2 & 0xffff) + (sum2 >> 16);
  return (sum2 << 16) | sum1;
}

// The one writer's checksum, vectorized and not, is HDF5's for every length around the
// 16-word groups and the 360-word folds, on random bytes and on all-ones (the largest sums).
TEST(Checkpoint, WritersFletcher32IsHdf5s) {
  std::mt19937 random(29);
  for (const std::size_t bytes :
       {std::size_t{0}, std::size_t{2}, std::size_t{30}, std::size_t{32}, std::size_t{34},
        std::size_t{718}, std::size_t{720}, std::size_t{722}, std::size_t{1442}, std::size_t{4096},
        std::size_t{(1 << 22) + 4}})
    for (const bool ones : {false, true}) {
      std::vector<std::uint8_t> data(bytes);
      for (auto& b : data)
        b = ones ? 0xff : static_cast<std::uint8_t>(random());
      const std::uint32_t want = hdf5_fletcher32(data);
      EXPECT_EQ(chunking::fletcher32(data.data(), bytes), want) << bytes << " bytes";
      EXPECT_EQ(chunking::fletcher32(data.data(), bytes, false), want) << bytes << " bytes";
    }
}

// Chunks of whole rows and at most 2^20 elements, as few as that allows with the rows
// spread evenly; of whole 4 KiB blocks where rounding the rows up pads the tensor by at
// most 1% (the one writer's driver then writes each chunk from the slab that holds it).
TEST(Checkpoint, ChunksAreWholeBlocksWhereThePaddingIsSmall) {
  using V = std::vector<hsize_t>;
  EXPECT_EQ(chunking::chunk_of({50257, 768}), (V{1360, 768}));  // 1359 spread evenly
  EXPECT_EQ(chunking::chunk_of({2304, 768}), (V{1152, 768}));   // already whole blocks
  EXPECT_EQ(chunking::chunk_of({768, 3072}), (V{256, 3072}));   // 3 MiB
  EXPECT_EQ(chunking::chunk_of({2099, 1000}), (V{700, 1000}));  // 768 rows would pad 10%
  EXPECT_EQ(chunking::chunk_of({3, 700000}), (V{1, 700000}));   // no multiple fits
  EXPECT_EQ(chunking::chunk_of({1000, 1000}), (V{1000, 1000})); // one chunk
  EXPECT_EQ(chunking::chunk_of({7}), (V{7}));
  for (hsize_t rows : {1000, 5000, 50257, 100003})
    for (hsize_t row : {1, 3, 64, 96, 768, 1000, 2304, 4097}) {
      const V chunk = chunking::chunk_of({rows, row});
      const hsize_t most = std::min<hsize_t>(rows, (hsize_t(1) << 20) / row);
      const hsize_t count = (rows + most - 1) / most, even = (rows + count - 1) / count;
      EXPECT_LE(chunk[0] * row, hsize_t(1) << 20) << rows << " x " << row;
      EXPECT_EQ((rows + chunk[0] - 1) / chunk[0], count) << rows << " x " << row;
      EXPECT_LE(100 * (count * chunk[0] - rows), std::max(rows, 100 * (count * even - rows)))
          << rows << " x " << row;
      if (count > 1 && chunk[0] != even)
        EXPECT_EQ(chunk[0] * row % 1024, 0u) << rows << " x " << row;
    }
}

// The first rank's slabs: a ring of twelve of the largest (in whole 4 KiB blocks); a
// tensor's slabs are one chunk, then twice the one before, up to 16 MiB of whole chunks,
// with one element for the last chunk's checksum; on more than one rank, two staging
// buffers (slab k's blocks of columns arrive in buffer k % 2, as large as the largest slab
// it took); the file driver's buffers; nothing under Writers::all on more than one rank (a
// single rank always writes alone).
TEST(Checkpoint, OneWritersBuffersAreSlabsStagingAndDriverChunks) {
  const auto blocks = [](std::uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  // The file driver's buffers: four of the largest chunk with its checksum (three for
  // copies, one of its thread's); none for chunks under 64 KiB, which it writes through the
  // page cache.
  const auto driver = [&](std::uint64_t chunk_bytes) { return 4 * blocks(chunk_bytes + 4); };
  // [50257, 768]: 37 chunks of 1360 rows (4 MiB, whole 4 KiB blocks), in slabs of 1, 2,
  // then 4 chunks (the last 2): staging buffers of 4 chunks each.
  const std::vector<std::vector<std::uint64_t>> gpt2 = {{50257, 768}, {768}};
  const auto chunks = [](std::uint64_t n, std::uint64_t chunk) { return (n * chunk + 1) * 4; };
  const std::uint64_t slab = chunks(4, 1360 * 768);
  EXPECT_EQ(writer_buffer_bytes(gpt2, Writers::one, 8),
            12 * blocks(slab) + 2 * slab + driver(1360 * 768 * 4));
  EXPECT_EQ(writer_buffer_bytes(gpt2, Writers::one, 1), 12 * blocks(slab) + driver(1360 * 768 * 4));
  // [2099, 1000]: three chunks of 700 rows, in slabs of one and two (the last one padded).
  EXPECT_EQ(writer_buffer_bytes({{2099, 1000}}, Writers::one, 8),
            12 * blocks(chunks(2, 700 * 1000)) + chunks(1, 700 * 1000) + chunks(2, 700 * 1000) +
                driver(700 * 1000 * 4));
  EXPECT_EQ(writer_buffer_bytes({{7, 5}}, Writers::one, 8), 12 * 4096 + (7ull * 5 + 1) * 4);
  EXPECT_EQ(writer_buffer_bytes(gpt2, Writers::all, 8), 0u);
  EXPECT_EQ(writer_buffer_bytes(gpt2, Writers::all, 1), writer_buffer_bytes(gpt2, Writers::one, 1));
}
