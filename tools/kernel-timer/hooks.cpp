// The Kokkos Tools entry points of libcubelm_kernel_timer (docs/kernels.md, "Timing
// kernels"). Kokkos finds them with dlsym in the library named by KOKKOS_TOOLS_LIBS
// (Kokkos 4 and later) or KOKKOS_PROFILE_LIBRARY (Kokkos 3.4). The signatures are
// those of Kokkos' C interface (core/src/impl/Kokkos_Profiling_C_Interface.h), the
// same from 3.4 to 5.x; the structs below repeat the layout of the two that cross it.
//
// Environment, read when Kokkos initializes:
//   CUBELM_KERNEL_TIMER_OUT=path    the table to path.<rank or pid>, not to stderr
//   CUBELM_KERNEL_TIMER_JSON=path   the figures as JSON to path.<rank or pid>
//   CUBELM_KERNEL_TIMER_TOP=N       rows per table (default 20, 0 for all)
//   CUBELM_KERNEL_TIMER_FENCE=0     do not ask Kokkos to fence around kernels

#include "kernel_timer.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#define CUBELM_KERNEL_TIMER_EXPORT extern "C" __attribute__((visibility("default")))

struct Kokkos_Profiling_KokkosPDeviceInfo {
  std::size_t deviceID;
};

struct Kokkos_Profiling_SpaceHandle {
  char name[64];
};

struct Kokkos_Tools_ToolSettings {
  bool requires_global_fencing;
  bool padding[255];
};

namespace cubelm::kernel_timer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The fences Kokkos makes before each callback for a tool that asks for global
// fencing carry this in their name (Kokkos 3.5 and later report fences at all).
bool is_tool_fence(const char* name) {
  return std::strstr(name, "Kokkos Profile Tool Fence") != nullptr;
}

constexpr std::uint64_t kUntimed = ~std::uint64_t{0};

struct Open {
  Kind kind;
  std::string name;
  Clock::time_point start;
};

struct Pending {
  std::string name;
  Clock::time_point start;
};

// Regions and deep copies have no id: each thread's callbacks pair up as a stack.
thread_local std::vector<Pending> regions;
thread_local std::vector<Pending> copies;

class State {
public:
  ~State() {
    // A program that exits without Kokkos::finalize still gets its report.
    if (initialized_ && !reported_)
      report(false);
  }

  void initialize(std::uint64_t interface_version) {
    const std::lock_guard<std::mutex> lock(mutex_);
    initialized_ = true;
    interface_version_ = interface_version;
    start_ = Clock::now();
    out_ = env("CUBELM_KERNEL_TIMER_OUT");
    json_ = env("CUBELM_KERNEL_TIMER_JSON");
    const std::string top = env("CUBELM_KERNEL_TIMER_TOP");
    if (!top.empty()) {
      char* end = nullptr;
      const long n = std::strtol(top.c_str(), &end, 10);
      if (*end != '\0' || n < 0)
        std::fprintf(stderr,
                     "cubelm kernel timer: CUBELM_KERNEL_TIMER_TOP = %s: must be a whole number "
                     "of rows, 0 or more (0 lists all); using %zu\n",
                     top.c_str(), top_);
      else
        top_ = static_cast<std::size_t>(n);
    }
  }

  void set_fencing(Fencing fencing) {
    const std::lock_guard<std::mutex> lock(mutex_);
    fencing_ = fencing;
  }

  std::uint64_t begin(Kind kind, const char* name) {
    std::string label(name ? name : "");
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t id = next_id_++;
    open_.emplace(id, Open{kind, std::move(label), Clock::now()});
    return id;
  }

  void end(std::uint64_t id) {
    const Clock::time_point now = Clock::now();
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = open_.find(id);
    if (it == open_.end()) {
      ++unmatched_;
      return;
    }
    add(it->second.kind, it->second.name, seconds(it->second.start, now));
    open_.erase(it);
  }

  void finish(Kind kind, const Pending& pending) {
    const Clock::time_point now = Clock::now();
    const std::lock_guard<std::mutex> lock(mutex_);
    add(kind, pending.name, seconds(pending.start, now));
  }

  void count_unmatched() {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++unmatched_;
  }

  void count_tool_fence() {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++tool_fences_;
  }

  void report(bool finalized) {
    const Clock::time_point now = Clock::now();
    const std::lock_guard<std::mutex> lock(mutex_);
    if (reported_)
      return;
    reported_ = true;
    Report r;
    r.wall_s = seconds(start_, now);
    r.pid = static_cast<long>(::getpid());
    r.rank = rank_from_environment();
    r.interface_version = interface_version_;
    r.fencing = fencing_;
    r.tool_fences = tool_fences_;
    r.unmatched = unmatched_;
    r.finalized = finalized;
    for (const auto& [key, stat] : stats_)
      r.entries.push_back(Entry{key.first, key.second, display_name(key.second), stat});

    const std::string table = format_table(r, top_);
    if (out_.empty() || !write(per_process_path(out_, r.rank, r.pid), table))
      std::fputs(table.c_str(), stderr);
    if (!json_.empty())
      write(per_process_path(json_, r.rank, r.pid), format_json(r));
  }

private:
  static std::string env(const char* name) {
    const char* value = std::getenv(name);
    return value ? value : "";
  }

  static bool write(const std::string& path, const std::string& text) {
    std::FILE* file = std::fopen(path.c_str(), "w");
    bool ok = file != nullptr && std::fwrite(text.data(), 1, text.size(), file) == text.size();
    if (file != nullptr && std::fclose(file) != 0)
      ok = false;
    if (!ok)
      std::fprintf(stderr, "cubelm kernel timer: cannot write %s: %s\n", path.c_str(),
                   std::strerror(errno));
    return ok;
  }

  void add(Kind kind, const std::string& name, double s) { stats_[{kind, name}].add(s); }

  std::mutex mutex_;
  bool initialized_ = false;
  bool reported_ = false;
  Clock::time_point start_ = Clock::now();
  std::uint64_t interface_version_ = 0;
  Fencing fencing_ = Fencing::unannounced;
  std::string out_;
  std::string json_;
  std::size_t top_ = 20;
  std::uint64_t next_id_ = 1;
  std::uint64_t tool_fences_ = 0;
  std::uint64_t unmatched_ = 0;
  std::unordered_map<std::uint64_t, Open> open_;
  std::map<std::pair<Kind, std::string>, Stat> stats_;
};

State& state() {
  static State s;
  return s;
}

void push(std::vector<Pending>& stack, std::string name) {
  stack.push_back(Pending{std::move(name), Clock::now()});
}

void pop(std::vector<Pending>& stack, Kind kind) {
  if (stack.empty()) {
    state().count_unmatched();
    return;
  }
  const Pending pending = std::move(stack.back());
  stack.pop_back();
  state().finish(kind, pending);
}

} // namespace
} // namespace cubelm::kernel_timer

using namespace cubelm::kernel_timer;

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_init_library(const int /*load_sequence*/,
                                                     const std::uint64_t interface_version,
                                                     const std::uint32_t /*device_count*/,
                                                     Kokkos_Profiling_KokkosPDeviceInfo*) {
  state().initialize(interface_version);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_finalize_library() {
  state().report(true);
}

// Kokkos asks once, after kokkosp_init_library (Kokkos 3.4 and later). Global fencing
// is Kokkos' default too; asking makes it this library's decision.
CUBELM_KERNEL_TIMER_EXPORT void kokkosp_request_tool_settings(const std::uint32_t,
                                                              Kokkos_Tools_ToolSettings* settings) {
  const char* fence = std::getenv("CUBELM_KERNEL_TIMER_FENCE");
  const bool wanted = fence == nullptr || std::strcmp(fence, "0") != 0;
  settings->requires_global_fencing = wanted;
  state().set_fencing(wanted ? Fencing::requested : Fencing::declined);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_begin_parallel_for(const char* name, const std::uint32_t,
                                                           std::uint64_t* id) {
  *id = state().begin(Kind::parallel_for, name);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_end_parallel_for(const std::uint64_t id) {
  state().end(id);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_begin_parallel_reduce(const char* name, const std::uint32_t,
                                                              std::uint64_t* id) {
  *id = state().begin(Kind::parallel_reduce, name);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_end_parallel_reduce(const std::uint64_t id) {
  state().end(id);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_begin_parallel_scan(const char* name, const std::uint32_t,
                                                            std::uint64_t* id) {
  *id = state().begin(Kind::parallel_scan, name);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_end_parallel_scan(const std::uint64_t id) {
  state().end(id);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_push_profile_region(const char* name) {
  push(regions, name ? name : "");
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_pop_profile_region() {
  pop(regions, Kind::region);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_begin_deep_copy(Kokkos_Profiling_SpaceHandle dst_space,
                                                        const char* dst_name, const void*,
                                                        Kokkos_Profiling_SpaceHandle src_space,
                                                        const char* src_name, const void*,
                                                        std::uint64_t) {
  // "dst <- src [DstSpace <- SrcSpace]": one row per pair of views and spaces.
  std::string name = std::string(dst_name ? dst_name : "") + " <- " + (src_name ? src_name : "");
  name += " [" + std::string(dst_space.name, strnlen(dst_space.name, sizeof dst_space.name)) +
          " <- " + std::string(src_space.name, strnlen(src_space.name, sizeof src_space.name)) +
          "]";
  push(copies, std::move(name));
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_end_deep_copy() {
  pop(copies, Kind::deep_copy);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_begin_fence(const char* name, const std::uint32_t,
                                                    std::uint64_t* id) {
  if (name != nullptr && is_tool_fence(name)) {
    state().count_tool_fence();
    *id = kUntimed;
    return;
  }
  *id = state().begin(Kind::fence, name);
}

CUBELM_KERNEL_TIMER_EXPORT void kokkosp_end_fence(const std::uint64_t id) {
  if (id != kUntimed)
    state().end(id);
}
