#pragma once
/// \file
/// \brief Errors a user can cause (exceptions) and failures of a library call
/// (checked, reported with rank and file:line, then MPI_Abort).
///
/// Two kinds of trouble, two mechanisms:
///  - cubelm::Error: a bad deck, data file, checkpoint or layout. The message
///    names the thing, the value and the rule. When every rank detects it the
///    same way (e.g. deck validation) it is marked collective and the program
///    ends cleanly with exit code 1; otherwise the rank that saw it aborts the job.
///  - CUBELM_*_CHECK: a failed MPI, HDF5, CUDA or NCCL call. It prints the rank,
///    file:line, the call and the library's own message, then calls MPI_Abort so
///    that no rank is left waiting in a collective.

#include <stdexcept>
#include <string>

namespace cubelm {

/// \brief An error the user can fix: bad deck, data, checkpoint or layout.
class Error : public std::runtime_error {
public:
  /// \brief `collective` says every rank raises the same error at the same point.
  explicit Error(const std::string& what, bool collective = false)
      : std::runtime_error(what), collective_(collective) {}
  /// \brief True when all ranks raise it together, so no abort is needed.
  bool collective() const { return collective_; }

private:
  bool collective_;
};

/// \brief Raised by CUBELM_ASSERT: a broken internal invariant or API misuse.
class InternalError : public std::logic_error {
public:
  using std::logic_error::logic_error;
};

namespace detail {

/// \brief A source file's path from its top folder of the checkout on ("src/io/checkpoint.cpp"),
/// however the build named it: absolute, or relative to the build directory (ccache's base_dir).
std::string source_path(const char* file);

/// \brief The text printed for a failed library call (kept apart for testing).
std::string format_failure(int rank, const char* library, const char* call,
                           const std::string& message, const char* file, int line);

/// \brief Prints the failure of `call` and aborts the whole MPI job.
[[noreturn]] void library_failure(const char* library, const char* call, const std::string& message,
                                  const char* file, int line);

/// \brief Turns an MPI error code into a failure report (MPI_Error_string).
[[noreturn]] void mpi_failure(int code, const char* call, const char* file, int line);

/// \brief Reports a failed HDF5 call with the innermost message of HDF5's error stack.
[[noreturn]] void hdf5_failure(const char* call, const char* file, int line);
/// The innermost message on HDF5's error stack (what a failed call says went wrong).
std::string hdf5_error_message();

[[noreturn]] void assert_failure(const char* cond, const std::string& message, const char* file,
                                 int line);

/// \brief World rank, or -1 before MPI_Init / after MPI_Finalize.
int world_rank_or_minus_one();

} // namespace detail
} // namespace cubelm

/// \brief Checks an MPI call; on failure reports and calls MPI_Abort.
#define CUBELM_MPI_CHECK(call)                                                                     \
  do {                                                                                             \
    const int cubelm_mpi_rc_ = (call);                                                             \
    if (cubelm_mpi_rc_ != 0 /* MPI_SUCCESS */)                                                     \
      ::cubelm::detail::mpi_failure(cubelm_mpi_rc_, #call, __FILE__, __LINE__);                    \
  } while (0)

/// \brief Checks an HDF5 call (negative herr_t/hid_t means failure).
#define CUBELM_HDF5_CHECK(call)                                                                    \
  do {                                                                                             \
    if ((call) < 0)                                                                                \
      ::cubelm::detail::hdf5_failure(#call, __FILE__, __LINE__);                                   \
  } while (0)

/// \brief Checks a CUDA runtime call (needs cuda_runtime.h in the including file).
#define CUBELM_CUDA_CHECK(call)                                                                    \
  do {                                                                                             \
    const cudaError_t cubelm_cuda_rc_ = (call);                                                    \
    if (cubelm_cuda_rc_ != cudaSuccess)                                                            \
      ::cubelm::detail::library_failure("CUDA", #call, cudaGetErrorString(cubelm_cuda_rc_),        \
                                        __FILE__, __LINE__);                                       \
  } while (0)

/// \brief Checks an NCCL call (needs nccl.h in the including file).
#define CUBELM_NCCL_CHECK(call)                                                                    \
  do {                                                                                             \
    const ncclResult_t cubelm_nccl_rc_ = (call);                                                   \
    if (cubelm_nccl_rc_ != ncclSuccess)                                                            \
      ::cubelm::detail::library_failure("NCCL", #call, ncclGetErrorString(cubelm_nccl_rc_),        \
                                        __FILE__, __LINE__);                                       \
  } while (0)

/// \brief Internal invariant: throws cubelm::InternalError with file:line.
#define CUBELM_ASSERT(cond, message)                                                               \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ::cubelm::detail::assert_failure(#cond, (message), __FILE__, __LINE__);                      \
  } while (0)
