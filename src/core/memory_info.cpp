#include "cubelm/core/memory_info.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace cubelm {

namespace {

// The first word of a one-line file, or nothing when it cannot be read.
std::optional<std::string> first_word(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word))
    return std::nullopt;
  return word;
}

std::optional<std::uint64_t> parse_bytes(const std::string& word) {
  if (word.empty() || word.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  try {
    return static_cast<std::uint64_t>(std::stoull(word));
  } catch (...) {
    return std::nullopt;
  }
}

// A cgroup limit: "max" (v2) and v1's "unlimited" (LONG_MAX rounded down to a page,
// anything from 2^62 up) mean no limit.
std::optional<std::uint64_t> read_limit(const std::string& path, bool& found) {
  const std::optional<std::string> word = first_word(path);
  found = word.has_value();
  if (!word || *word == "max")
    return std::nullopt;
  const std::optional<std::uint64_t> bytes = parse_bytes(*word);
  if (bytes && *bytes >= (std::uint64_t{1} << 62))
    return std::nullopt;
  return bytes;
}

} // namespace

std::optional<std::uint64_t> read_mem_available(const std::string& proc_root) {
  std::ifstream in(proc_root + "/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0)
      continue;
    std::istringstream fields(line.substr(13));
    std::uint64_t value = 0;
    std::string unit;
    if (!(fields >> value))
      return std::nullopt;
    fields >> unit;
    if (unit == "kB" || unit == "KB" || unit == "kiB")
      value *= 1024;
    return value;
  }
  return std::nullopt;
}

HostMemory read_host_memory(const std::string& proc_root, const std::string& cgroup_root) {
  HostMemory m;
  m.meminfo = read_mem_available(proc_root);
  bool found = false;
  // cgroup v2: the unified hierarchy has memory.max where this process's group is mounted.
  std::optional<std::uint64_t> limit = read_limit(cgroup_root + "/memory.max", found);
  std::string usage_file = cgroup_root + "/memory.current";
  std::string version = "v2";
  if (!found) {
    limit = read_limit(cgroup_root + "/memory/memory.limit_in_bytes", found);
    usage_file = cgroup_root + "/memory/memory.usage_in_bytes";
    version = "v1";
  }
  if (found && limit) {
    const std::optional<std::string> word = first_word(usage_file);
    const std::optional<std::uint64_t> usage = word ? parse_bytes(*word) : std::nullopt;
    m.cgroup_limit = limit;
    m.cgroup_usage = usage.value_or(0);
    m.cgroup_version = version;
  }
  return m;
}

std::optional<std::uint64_t> HostMemory::cgroup_headroom() const {
  if (!cgroup_limit)
    return std::nullopt;
  return *cgroup_limit > cgroup_usage ? *cgroup_limit - cgroup_usage : 0;
}

std::optional<std::uint64_t> HostMemory::available() const {
  const std::optional<std::uint64_t> headroom = cgroup_headroom();
  if (meminfo && headroom)
    return std::min(*meminfo, *headroom);
  return meminfo ? meminfo : headroom;
}

std::string HostMemory::describe() const {
  std::string s;
  if (meminfo)
    s = "MemAvailable " + format_bytes(static_cast<double>(*meminfo));
  if (cgroup_limit) {
    if (!s.empty())
      s += ", ";
    s += "cgroup " + cgroup_version + " limit " + format_bytes(static_cast<double>(*cgroup_limit)) +
         " - usage " + format_bytes(static_cast<double>(cgroup_usage));
  }
  return s.empty() ? "no /proc/meminfo and no cgroup limit" : s;
}

std::string format_bytes(double bytes) {
  // GiB is the largest unit: needs and node memories compare at a glance.
  static const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 3) {
    bytes /= 1024.0;
    ++u;
  }
  char text[48];
  std::snprintf(text, sizeof(text), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return text;
}

} // namespace cubelm
