#include "cubelm/tp/param.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/core/random.hpp"

#include <cmath>

namespace cubelm::tp {

namespace {

// FNV-1a: a stable hash of the parameter name (std::hash differs between libraries).
std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// A uniform double in (0, 1] from the top 53 bits.
double unit(std::uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53;
}

} // namespace

double init_normal(std::uint64_t seed, const std::string& name, std::int64_t index) {
  const std::uint64_t key = splitmix64(seed ^ splitmix64(name_hash(name)));
  const std::uint64_t a = splitmix64(key + 2 * static_cast<std::uint64_t>(index));
  const std::uint64_t b = splitmix64(key + 2 * static_cast<std::uint64_t>(index) + 1);
  const double two_pi = 6.283185307179586;
  return std::sqrt(-2.0 * std::log(unit(a))) * std::cos(two_pi * unit(b));
}

template <class T>
Param<T> make_param(const std::string& name, const std::vector<std::int64_t>& shape,
                    const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& local,
                    double std_dev, double fill, std::uint64_t seed, std::int64_t stored_rows) {
  CUBELM_ASSERT(shape.size() == offset.size() && shape.size() == local.size() &&
                    (shape.size() == 1 || shape.size() == 2),
                "parameter '" + name + "': shape, offset and block must have rank 1 or 2");
  std::int64_t n = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    CUBELM_ASSERT(offset[d] >= 0 && local[d] >= 0 && offset[d] + local[d] <= shape[d],
                  "parameter '" + name + "': block outside the tensor");
    n *= local[d];
  }
  Param<T> p;
  p.name = name;
  p.shape = shape;
  p.offset = offset;
  p.local = local;
  p.decay = shape.size() >= 2;
  const std::int64_t rows = stored_rows >= 0 && stored_rows < shape[0] ? stored_rows : shape[0];
  p.padding_rows = shape[0] - rows;
  using M = compute_t<T>;
  p.value = Vec<M>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::" + name), n);
  p.grad = Vec<M>("cubelm::grad::" + name, n);
  auto h = Kokkos::create_mirror_view(p.value);
  const std::int64_t cols = shape.size() == 2 ? shape[1] : 1;
  const std::int64_t local_cols = shape.size() == 2 ? local[1] : 1;
  const std::int64_t row0 = offset[0], col0 = shape.size() == 2 ? offset[1] : 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t row = row0 + i / local_cols;
    const std::int64_t global = row * cols + col0 + i % local_cols;
    h(i) = row >= rows
               ? M(0)
               : static_cast<M>(std_dev > 0 ? std_dev * init_normal(seed, name, global) : fill);
  }
  Kokkos::deep_copy(p.value, h);
  refresh_weights(ExecSpace(), p);
  return p;
}

template <class T>
void refresh_weights(const ExecSpace& exec, Param<T>& p) {
  if constexpr (!std::is_same_v<T, compute_t<T>>) {
    if (p.copy.extent(0) != p.value.extent(0))
      p.copy = Vec<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::copy::" + p.name),
                      p.value.extent(0));
    const Vec<T> copy = p.copy;
    const Vec<compute_t<T>> value = p.value;
    Kokkos::parallel_for(
        "cubelm::refresh_weights", Kokkos::RangePolicy<ExecSpace>(exec, 0, value.extent(0)),
        KOKKOS_LAMBDA(const std::size_t i) { copy(i) = value(i); });
  } else {
    (void)exec;
    (void)p;
  }
}

template Param<float> make_param<float>(const std::string&, const std::vector<std::int64_t>&,
                                        const std::vector<std::int64_t>&,
                                        const std::vector<std::int64_t>&, double, double,
                                        std::uint64_t, std::int64_t);
template Param<bf16> make_param<bf16>(const std::string&, const std::vector<std::int64_t>&,
                                      const std::vector<std::int64_t>&,
                                      const std::vector<std::int64_t>&, double, double,
                                      std::uint64_t, std::int64_t);
template void refresh_weights<float>(const ExecSpace&, Param<float>&);
template void refresh_weights<double>(const ExecSpace&, Param<double>&);
template void refresh_weights<bf16>(const ExecSpace&, Param<bf16>&);
template Param<double> make_param<double>(const std::string&, const std::vector<std::int64_t>&,
                                          const std::vector<std::int64_t>&,
                                          const std::vector<std::int64_t>&, double, double,
                                          std::uint64_t, std::int64_t);

} // namespace cubelm::tp
