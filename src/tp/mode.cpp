#include "cubelm/tp/mode.hpp"

#include "modes.hpp"

namespace cubelm::tp {

template <class T>
std::unique_ptr<Mode<T>> make_mode(const comm::ProcessGrid& grid) {
  switch (grid.layout().mode) {
  case TensorMode::d2:
    return detail::make_2d<T>(grid);
  case TensorMode::d3:
    return detail::make_3d<T>(grid);
  case TensorMode::none:
  case TensorMode::d1:
    break;
  }
  return detail::make_1d<T>(grid);
}

template std::unique_ptr<Mode<float>> make_mode<float>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<double>> make_mode<double>(const comm::ProcessGrid&);
template std::unique_ptr<Mode<bf16>> make_mode<bf16>(const comm::ProcessGrid&);

} // namespace cubelm::tp
