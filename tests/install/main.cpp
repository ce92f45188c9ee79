// Uses the installed cubelm: one layout check and one collective on a View.
#include <cubelm/comm/grid.hpp>
#include <cubelm/core/environment.hpp>
#include <cubelm/core/types.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  cubelm::Environment env(argc, argv);
  {
    const cubelm::comm::ProcessGrid grid(cubelm::comm::Layout{1, 1, 1, cubelm::TensorMode::none},
                                         cubelm::comm::Communicator::world());
    cubelm::View1<float> v("v", 3);
    Kokkos::deep_copy(v, 2.0f);
    grid.world().all_reduce(cubelm::ExecSpace(), v);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    std::printf("consumer ok: %g\n", static_cast<double>(h(0)));
  }
  return 0;
}
