#include "cubelm/core/error.hpp"

#include <hdf5.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace cubelm::detail {

int world_rank_or_minus_one() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string source_path(const char* file) {
  const std::string path(file);
  for (std::size_t at = 0; at < path.size();) {
    const std::size_t end = path.find('/', at);
    if (end == std::string::npos)
      break;
    const std::string part = path.substr(at, end - at);
    if (part == "src" || part == "include" || part == "tests" || part == "perf")
      return path.substr(at);
    at = end + 1;
  }
  return path;
}

std::string format_failure(int rank, const char* library, const char* call,
                           const std::string& message, const char* file, int line) {
  std::ostringstream out;
  out << "cubelm: rank " << rank << ": " << library << " error at " << source_path(file) << ":"
      << line << ": " << call << ": " << message;
  return out.str();
}

void library_failure(const char* library, const char* call, const std::string& message,
                     const char* file, int line) {
  const int rank = world_rank_or_minus_one();
  const std::string text = format_failure(rank, library, call, message, file, line);
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
  if (rank >= 0)
    MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void mpi_failure(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    std::snprintf(text, sizeof(text), "MPI error code %d", code);
  library_failure("MPI", call, std::string(text, static_cast<std::size_t>(length)), file, line);
}

namespace {
// Walks HDF5's error stack from the API call inwards and keeps the innermost
// description, which is the one that says what actually went wrong.
herr_t keep_innermost(unsigned, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (err->desc != nullptr) {
    *out = err->desc;
    if (err->func_name != nullptr)
      *out += std::string(" (in ") + err->func_name + ")";
  }
  return 0;
}
} // namespace

std::string hdf5_error_message() {
  std::string message = "no message on the HDF5 error stack";
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, keep_innermost, &message);
  return message;
}

void hdf5_failure(const char* call, const char* file, int line) {
  library_failure("HDF5", call, hdf5_error_message(), file, line);
}

void assert_failure(const char* cond, const std::string& message, const char* file, int line) {
  std::ostringstream out;
  out << "internal check failed at " << source_path(file) << ":" << line << ": " << cond << ": "
      << message;
  throw InternalError(out.str());
}

} // namespace cubelm::detail
