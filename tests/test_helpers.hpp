#pragma once
// Small helpers shared by the model tests.

#include "cubelm/comm/communicator.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

/// Expects `needle` in the text `haystack` (an error message), printing both when it is not.
#define EXPECT_HAS(haystack, needle)                                                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                                 \
      << "message: " << (haystack) << "\nmissing: " << (needle)

namespace cubelm::testing {

/// A model shape for tests: `vocab` tokens, context 4, 2 layers.
inline ModelConfig tiny_model(int vocab, int hidden, int heads) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.seq_len = 4;
  c.hidden = hidden;
  c.heads = heads;
  c.layers = 2;
  return c;
}

/// `n` token ids below `vocab` from a seeded generator.
inline std::vector<std::int32_t> random_tokens(int n, int vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> t(n);
  for (auto& x : t)
    x = static_cast<std::int32_t>(gen() % vocab);
  return t;
}

/// Ranks of the job (MPI_COMM_WORLD).
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// This process alone, as a communicator (single-process references).
inline comm::Communicator self() {
  return comm::Communicator::duplicate(MPI_COMM_SELF);
}

/// A file name in the temporary directory, the same on every rank (rank 0's pid).
inline std::string temp_path(const char* stem) {
  long long id = static_cast<long long>(::getpid());
  MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() / (stem + std::to_string(id) + ".h5")).string();
}

/// \brief A fresh folder under the system's temporary directory, named after the process and
/// the running test, removed at the end of the test.
class TempDir {
public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("cubelm_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" +
            info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// \brief The path of `name` in the folder.
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  /// \brief Writes `text` as the file `name` of the folder and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

private:
  std::filesystem::path dir_;
};

/// The message of the cubelm::Error that `f` raises, which must be collective (raised on
/// every rank) or not as `collective` says; "" and a test failure when `f` raises none or
/// another exception.
inline std::string error_of(const std::function<void()>& f, bool collective) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.collective(), collective)
        << (collective ? "expected an error raised on every rank: "
                       : "expected an error of one rank: ")
        << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected cubelm::Error, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no cubelm::Error raised";
  return "";
}

/// The message of the cubelm::InternalError (an internal check, API misuse) that `f`
/// raises; "" and a test failure when `f` raises none or another exception.
inline std::string internal_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InternalError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected cubelm::InternalError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no cubelm::InternalError raised";
  return "";
}

} // namespace cubelm::testing
