#pragma once
// Fills the table that cubelm::world_devices() returns; Environment calls it once,
// after gathering every rank's DeviceKey. Internal to src/core.

#include "cubelm/core/devices.hpp"

#include <vector>

namespace cubelm {

void set_world_devices(std::vector<DeviceKey> devices);

} // namespace cubelm
