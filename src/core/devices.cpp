#include "cubelm/core/devices.hpp"

#include "device_table.hpp"

#include <utility>

namespace cubelm {

namespace {
std::vector<DeviceKey>& table() {
  static std::vector<DeviceKey> devices;
  return devices;
}
} // namespace

const std::vector<DeviceKey>& world_devices() {
  return table();
}

void set_world_devices(std::vector<DeviceKey> devices) {
  table() = std::move(devices);
}

} // namespace cubelm
