#include "cubelm/core/config.hpp"

#include <cstddef>
#include <utility>

namespace cubelm {

namespace {

// One table of names per enum: the name of a value, and a value of a name.
template <class E, std::size_t N>
const char* name_of(const std::pair<E, const char*> (&names)[N], E value) {
  for (const auto& [v, n] : names)
    if (v == value)
      return n;
  return "?";
}

template <class E, std::size_t N>
std::optional<E> value_of(const std::pair<E, const char*> (&names)[N], const std::string& text) {
  for (const auto& [v, n] : names)
    if (text == n)
      return v;
  return std::nullopt;
}

const std::pair<TensorMode, const char*> kModes[] = {{TensorMode::none, "none"},
                                                     {TensorMode::d1, "1d"},
                                                     {TensorMode::d2, "2d"},
                                                     {TensorMode::d3, "3d"}};
const std::pair<Schedule, const char*> kSchedules[] = {{Schedule::gpipe, "gpipe"},
                                                       {Schedule::one_f_one_b, "1f1b"},
                                                       {Schedule::interleaved, "interleaved"},
                                                       {Schedule::layered, "layered"}};
const std::pair<Recompute, const char*> kRecompute[] = {{Recompute::none, "none"},
                                                        {Recompute::full, "full"}};
const std::pair<Precision, const char*> kPrecision[] = {
    {Precision::fp32, "fp32"}, {Precision::tf32, "tf32"}, {Precision::bf16, "bf16"}};

} // namespace

const char* mode_name(TensorMode mode) {
  return name_of(kModes, mode);
}
std::optional<TensorMode> parse_mode(const std::string& text) {
  return value_of(kModes, text);
}
const char* schedule_name(Schedule schedule) {
  return name_of(kSchedules, schedule);
}
std::optional<Schedule> parse_schedule(const std::string& text) {
  return value_of(kSchedules, text);
}
const char* precision_name(Precision precision) {
  return name_of(kPrecision, precision);
}
std::optional<Precision> parse_precision(const std::string& text) {
  return value_of(kPrecision, text);
}

const char* recompute_name(Recompute recompute) {
  return name_of(kRecompute, recompute);
}
std::optional<Recompute> parse_recompute(const std::string& text) {
  return value_of(kRecompute, text);
}

} // namespace cubelm
