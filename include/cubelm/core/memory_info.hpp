#pragma once
/// \file
/// \brief How much host memory a process may still take: MemAvailable of
/// /proc/meminfo and the headroom of its memory cgroup (v2 or v1), the smaller
/// of the two. Plain file reading, no MPI and no Kokkos; the roots are
/// parameters so that tests can point them at fake files.

#include <cstdint>
#include <optional>
#include <string>

namespace cubelm {

/// \brief What the host has left for this process (bytes), and where it was read.
struct HostMemory {
  std::optional<std::uint64_t> meminfo;      ///< MemAvailable of /proc/meminfo
  std::optional<std::uint64_t> cgroup_limit; ///< the cgroup's limit (absent: none, or "max")
  std::uint64_t cgroup_usage = 0;            ///< the cgroup's usage (0 without a limit)
  std::string cgroup_version;                ///< "v2", "v1" or "" (no limit found)

  /// \brief The cgroup's limit minus its usage (0 when the usage reached it).
  std::optional<std::uint64_t> cgroup_headroom() const;
  /// \brief min(MemAvailable, cgroup headroom); nothing when neither could be read.
  std::optional<std::uint64_t> available() const;
  /// \brief e.g. "MemAvailable 12.3 GiB, cgroup v2 limit 8.0 GiB - usage 1.2 GiB".
  std::string describe() const;
};

/// \brief MemAvailable of `<proc_root>/meminfo` in bytes, if the file has it.
std::optional<std::uint64_t> read_mem_available(const std::string& proc_root);

/// \brief Reads `<proc_root>/meminfo` and the memory cgroup under `cgroup_root`:
/// v2 `memory.max` and `memory.current`, else v1 `memory/memory.limit_in_bytes`
/// and `memory/memory.usage_in_bytes`. "max" (v2) or a v1 limit near 2^63 is no limit.
HostMemory read_host_memory(const std::string& proc_root = "/proc",
                            const std::string& cgroup_root = "/sys/fs/cgroup");

/// \brief Bytes as "512 B", "12.0 MiB", "86000.0 GiB" (binary units, GiB the largest).
std::string format_bytes(double bytes);

} // namespace cubelm
