#include "cubelm/core/devices.hpp"

#include "device_table.hpp"

// Kokkos' macros say which runtime this build has; nothing else of Kokkos is used.
#include <Kokkos_Macros.hpp>

#include <cstdio>
#include <utility>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

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

#ifdef KOKKOS_ENABLE_CUDA

namespace {
std::string api_version(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
} // namespace

int usable_devices(std::string* why) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (why != nullptr)
      *why = cudaGetErrorString(rc);
    cudaGetLastError(); // the error is not sticky: leave none behind
    return 0;
  }
  if (count == 0 && why != nullptr)
    *why = "the CUDA runtime lists no device";
  return count;
}

std::string device_summary() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver); // 0 when no driver is installed
  std::string out = "CUDA runtime " + api_version(runtime) + ", driver API " +
                    (driver > 0 ? api_version(driver) : std::string("none (no NVIDIA driver)"));
  std::string why;
  const int count = usable_devices(&why);
  if (count == 0)
    return out + "; no usable GPU: " + why;
  out += "; " + std::to_string(count) + " GPU" + (count == 1 ? "" : "s") + ":";
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
      cudaGetLastError();
      out += " [" + std::to_string(d) + "] (properties unreadable)";
      continue;
    }
    char buf[320];
    std::snprintf(buf, sizeof(buf), " [%d] %s (sm_%d%d, %d SMs, %.1f GiB)", d, p.name, p.major,
                  p.minor, p.multiProcessorCount,
                  static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    out += buf;
  }
  return out;
}

#else

int usable_devices(std::string* why) {
  if (why != nullptr)
    *why = "host build (no GPU backend)";
  return 0;
}

std::string device_summary() {
  return "none: host build (Kokkos without a GPU backend)";
}

#endif

} // namespace cubelm
