#include "cubelm/core/mpi_wait.hpp"

#include "cubelm/core/error.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace cubelm {

void wait_all(std::vector<MPI_Request>& requests, bool asleep) {
  if (!asleep) {
    CUBELM_MPI_CHECK(
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
    return;
  }
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    int done = 0;
    CUBELM_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                                 MPI_STATUSES_IGNORE));
    if (done)
      return;
    std::this_thread::sleep_for(pause);
    pause = std::min(2 * pause, std::chrono::microseconds(200));
  }
}

} // namespace cubelm
