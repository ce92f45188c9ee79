// libcubelm_kernel_timer against known durations: this program loads the library as
// Kokkos does (dlopen, dlsym), calls its hooks around sleeps and reads back the JSON
// and the table. Every interval the library measures lies inside one measured here
// around the begin and end calls and holds the sleep, so each figure has a lower and
// an upper bound however loaded the machine is.
//
//   kernel_timer_hooks LIBRARY WORKDIR
//
// Prints "kernel_timer_hooks: ok" when every check holds.

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;

struct SpaceHandle {
  char name[64];
};

struct ToolSettings {
  bool requires_global_fencing;
  bool padding[255];
};

// The entry points, as Kokkos declares them (Kokkos_Profiling_C_Interface.h).
struct Hooks {
  void (*init)(int, std::uint64_t, std::uint32_t, void*);
  void (*finalize)();
  void (*request_tool_settings)(std::uint32_t, ToolSettings*);
  void (*begin_for)(const char*, std::uint32_t, std::uint64_t*);
  void (*end_for)(std::uint64_t);
  void (*begin_reduce)(const char*, std::uint32_t, std::uint64_t*);
  void (*end_reduce)(std::uint64_t);
  void (*begin_scan)(const char*, std::uint32_t, std::uint64_t*);
  void (*end_scan)(std::uint64_t);
  void (*push_region)(const char*);
  void (*pop_region)();
  void (*begin_deep_copy)(SpaceHandle, const char*, const void*, SpaceHandle, const char*,
                          const void*, std::uint64_t);
  void (*end_deep_copy)();
  void (*begin_fence)(const char*, std::uint32_t, std::uint64_t*);
  void (*end_fence)(std::uint64_t);
};

int failures = 0;

#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      ++failures;                                                                                  \
      std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                  \
      std::printf(__VA_ARGS__);                                                                    \
      std::printf("\n");                                                                           \
    }                                                                                              \
  } while (false)

template <class F>
void load(void* library, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(library, name));
  if (f == nullptr) {
    std::printf("FAIL: %s is not exported: %s\n", name, dlerror());
    std::exit(1);
  }
}

Hooks open_library(const char* path) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::printf("FAIL: dlopen(%s): %s\n", path, dlerror());
    std::exit(1);
  }
  Hooks h{};
  load(library, "kokkosp_init_library", h.init);
  load(library, "kokkosp_finalize_library", h.finalize);
  load(library, "kokkosp_request_tool_settings", h.request_tool_settings);
  load(library, "kokkosp_begin_parallel_for", h.begin_for);
  load(library, "kokkosp_end_parallel_for", h.end_for);
  load(library, "kokkosp_begin_parallel_reduce", h.begin_reduce);
  load(library, "kokkosp_end_parallel_reduce", h.end_reduce);
  load(library, "kokkosp_begin_parallel_scan", h.begin_scan);
  load(library, "kokkosp_end_parallel_scan", h.end_scan);
  load(library, "kokkosp_push_profile_region", h.push_region);
  load(library, "kokkosp_pop_profile_region", h.pop_region);
  load(library, "kokkosp_begin_deep_copy", h.begin_deep_copy);
  load(library, "kokkosp_end_deep_copy", h.end_deep_copy);
  load(library, "kokkosp_begin_fence", h.begin_fence);
  load(library, "kokkosp_end_fence", h.end_fence);
  return h;
}

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The JSON writes one entry per line: the line of `name`, or "".
std::string entry(const std::string& json, const std::string& name) {
  const std::string key = "\"name\": \"" + name + "\",";
  const auto at = json.find(key);
  if (at == std::string::npos)
    return "";
  const auto start = json.rfind('\n', at) + 1;
  return json.substr(start, json.find('\n', at) - start);
}

double number(const std::string& text, const std::string& key) {
  const std::string quoted = "\"" + key + "\": ";
  const auto at = text.find(quoted);
  if (at == std::string::npos)
    return -1;
  return std::strtod(text.c_str() + at + quoted.size(), nullptr);
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// lo <= x <= hi
#define EXPECT_WITHIN(x, lo, hi) EXPECT((lo) <= (x) && (x) <= (hi), "%g not in [%g, %g]", x, lo, hi)

void unset_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    unsetenv(name);
}

// In a child process: rank `rank` from `variable`, one kernel, and either Kokkos'
// finalize or a plain exit (the report must then come from the library's unloading).
int child(const char* library, const std::string& dir, const char* variable, const char* rank,
          bool finalize) {
  const pid_t pid = fork();
  if (pid == 0) {
    unset_ranks();
    setenv(variable, rank, 1);
    const Hooks h = open_library(library);
    h.init(0, 20210225, 0, nullptr);
    std::uint64_t id = 0;
    h.begin_for("test::child", 0, &id);
    sleep_ms(1);
    h.end_for(id);
    if (finalize)
      h.finalize();
    std::exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child for rank %s: status %d", rank,
         status);
  const std::string json = read(dir + "/figures.json." + rank);
  EXPECT(has(json, "\"rank\": \"" + std::string(rank) + "\""), "figures.json.%s: %s", rank,
         json.c_str());
  EXPECT(number(entry(json, "test::child"), "calls") == 1, "figures.json.%s: %s", rank,
         json.c_str());
  EXPECT(has(json, finalize ? "\"finalized\": true" : "\"finalized\": false"), "%s", json.c_str());
  const std::string table = read(dir + "/table.txt." + rank);
  EXPECT(has(table, "rank " + std::string(rank) + ", pid "), "table.txt.%s: %s", rank,
         table.c_str());
  EXPECT(finalize || has(table, "Kokkos::finalize was not reached"), "%s", table.c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kernel_timer_hooks LIBRARY WORKDIR\n");
    return 2;
  }
  const char* library = argv[1];
  const std::string dir = argv[2];
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  setenv("CUBELM_KERNEL_TIMER_OUT", (dir + "/table.txt").c_str(), 1);
  setenv("CUBELM_KERNEL_TIMER_JSON", (dir + "/figures.json").c_str(), 1);
  unsetenv("CUBELM_KERNEL_TIMER_FENCE");

  // One file per process: the rank from the launcher's variables, the pid without.
  child(library, dir, "OMPI_COMM_WORLD_RANK", "3", true);
  child(library, dir, "SLURM_PROCID", "5", false);

  unset_ranks();
  setenv("CUBELM_KERNEL_TIMER_TOP", "3", 1);
  const Clock::time_point run = Clock::now();
  const Hooks h = open_library(library);
  h.init(0, 20210225, 0, nullptr);
  ToolSettings settings{};
  h.request_tool_settings(1, &settings);
  EXPECT(settings.requires_global_fencing, "the library must ask Kokkos for global fencing");

  // Three launches of one kernel: 20, 10 and 30 ms.
  double sleep_outer[3];
  const int sleep_ms_of[3] = {20, 10, 30};
  for (int i = 0; i < 3; ++i) {
    const Clock::time_point t = Clock::now();
    std::uint64_t id = 0;
    h.begin_for("test::sleep", 0, &id);
    sleep_ms(sleep_ms_of[i]);
    h.end_for(id);
    sleep_outer[i] = since(t);
  }

  // Two kernels open at once (a reduce of 10 ms and a scan of 25 ms), ended in launch
  // order: their ids pair them, not a stack.
  std::uint64_t a = 0, b = 0;
  const Clock::time_point ta = Clock::now();
  h.begin_reduce("test::reduce", 0, &a);
  sleep_ms(5);
  const Clock::time_point tb = Clock::now();
  h.begin_scan("test::scan", 0, &b);
  sleep_ms(5);
  h.end_reduce(a);
  const double a_outer = since(ta);
  sleep_ms(20);
  h.end_scan(b);
  const double b_outer = since(tb);
  EXPECT(a != b, "two open kernels got the same id %llu", static_cast<unsigned long long>(a));

  // Nested regions: outer 10 + inner 20 + 10 ms.
  const Clock::time_point to = Clock::now();
  h.push_region("test::outer");
  sleep_ms(10);
  const Clock::time_point ti = Clock::now();
  h.push_region("test::inner");
  sleep_ms(20);
  h.pop_region();
  const double inner_outer = since(ti);
  sleep_ms(10);
  h.pop_region();
  const double outer_outer = since(to);

  // A deep copy and a fence of the program's, and one that Kokkos makes for the tool.
  SpaceHandle host{}, cuda{};
  std::strcpy(host.name, "Host");
  std::strcpy(cuda.name, "Cuda");
  const Clock::time_point tc = Clock::now();
  h.begin_deep_copy(host, "dst", nullptr, cuda, "src", nullptr, 1024);
  sleep_ms(5);
  h.end_deep_copy();
  const double copy_outer = since(tc);
  std::uint64_t f = 0;
  const Clock::time_point tf = Clock::now();
  h.begin_fence("test::fence", 0, &f);
  sleep_ms(5);
  h.end_fence(f);
  const double fence_outer = since(tf);
  h.begin_fence("Kokkos::Tools::invoke_kokkosp_callback: Kokkos Profile Tool Fence", 0, &f);
  h.end_fence(f);

  // Names as Kokkos 3.4 passes unlabelled kernels: typeid names, "functor/tag".
  for (const char* name :
       {"N6cubelm4test7FunctorE", "ZN6cubelm4test3runEvEUliE_/N6cubelm4test3TagE",
        "N6cubelm12_GLOBAL__N_13BarINS_3FooEEE", "i", "cubelm::adamw"}) {
    std::uint64_t id = 0;
    h.begin_for(name, 0, &id);
    h.end_for(id);
  }

  // Callbacks without a partner are counted and ignored.
  h.end_for(987654321);
  h.pop_region();
  h.end_deep_copy();

  const double run_outer_before_finalize = since(run);
  h.finalize();
  h.finalize(); // Kokkos calls it once; a second call must not write again
  const double run_outer = since(run);

  const std::string pid = std::to_string(getpid());
  const std::string json = read(dir + "/figures.json." + pid);
  const std::string table = read(dir + "/table.txt." + pid);
  EXPECT(!json.empty(), "no %s/figures.json.%s", dir.c_str(), pid.c_str());
  EXPECT(!table.empty(), "no %s/table.txt.%s", dir.c_str(), pid.c_str());

  const std::string sleep = entry(json, "test::sleep");
  EXPECT(number(sleep, "calls") == 3, "%s", sleep.c_str());
  EXPECT_WITHIN(number(sleep, "min_s"), 0.010, sleep_outer[1]);
  EXPECT_WITHIN(number(sleep, "max_s"), 0.030, sleep_outer[2]);
  EXPECT_WITHIN(number(sleep, "total_s"), 0.060, sleep_outer[0] + sleep_outer[1] + sleep_outer[2]);
  EXPECT_WITHIN(number(sleep, "mean_s"), 0.020,
                (sleep_outer[0] + sleep_outer[1] + sleep_outer[2]) / 3);
  EXPECT(has(sleep, "\"kind\": \"parallel_for\""), "%s", sleep.c_str());

  const std::string reduce = entry(json, "test::reduce");
  const std::string scan = entry(json, "test::scan");
  EXPECT(has(reduce, "\"kind\": \"parallel_reduce\"") && has(scan, "\"kind\": \"parallel_scan\""),
         "%s / %s", reduce.c_str(), scan.c_str());
  EXPECT_WITHIN(number(reduce, "total_s"), 0.010, a_outer);
  EXPECT_WITHIN(number(scan, "total_s"), 0.025, b_outer);

  const std::string outer = entry(json, "test::outer");
  const std::string inner = entry(json, "test::inner");
  EXPECT(has(outer, "\"kind\": \"region\""), "%s", outer.c_str());
  EXPECT_WITHIN(number(outer, "total_s"), 0.040, outer_outer);
  EXPECT_WITHIN(number(inner, "total_s"), 0.020, inner_outer);
  EXPECT(number(inner, "total_s") < number(outer, "total_s"), "%s / %s", inner.c_str(),
         outer.c_str());

  const std::string copy = entry(json, "dst <- src [Host <- Cuda]");
  EXPECT(has(copy, "\"kind\": \"deep_copy\""), "%s", json.c_str());
  EXPECT_WITHIN(number(copy, "total_s"), 0.005, copy_outer);
  const std::string fence = entry(json, "test::fence");
  EXPECT(has(fence, "\"kind\": \"fence\""), "%s", json.c_str());
  EXPECT_WITHIN(number(fence, "total_s"), 0.005, fence_outer);
  EXPECT(!has(json, "Kokkos Profile Tool Fence"), "the tool's own fence is listed: %s",
         json.c_str());
  EXPECT(number(json, "tool_fences") == 1, "%s", json.c_str());
  EXPECT(number(json, "unmatched") == 3, "%s", json.c_str());

  for (const char* name :
       {"cubelm::test::Functor", "cubelm::test::run()::{lambda(...)#1}/cubelm::test::Tag",
        "cubelm::Bar<...>", "i", "cubelm::adamw"})
    EXPECT(number(entry(json, name), "calls") == 1, "no entry named %s in %s", name, json.c_str());
  EXPECT(has(entry(json, "cubelm::test::Functor"), "\"raw_name\": \"N6cubelm4test7FunctorE\""),
         "%s", json.c_str());

  // The sums: the kernels' total is the sum of their rows, each share its part of it,
  // and the run's time holds them all.
  const double kernels = number(json, "kernel_total_s");
  double sum = 0;
  for (const char* name : {"test::sleep", "test::reduce", "test::scan", "cubelm::test::Functor",
                           "cubelm::test::run()::{lambda(...)#1}/cubelm::test::Tag",
                           "cubelm::Bar<...>", "i", "cubelm::adamw"})
    sum += number(entry(json, name), "total_s");
  EXPECT(std::abs(kernels - sum) <= 1e-6, "kernel_total_s %g, sum of the kernels %g", kernels, sum);
  EXPECT(number(json, "kernel_calls") == 10, "%s", json.c_str());
  EXPECT(std::abs(number(sleep, "share") - number(sleep, "total_s") / kernels) < 1e-6, "%s",
         sleep.c_str());
  EXPECT_WITHIN(number(json, "wall_s"), number(outer, "total_s") + kernels, run_outer);
  EXPECT(number(json, "wall_s") <= run_outer_before_finalize, "%s", json.c_str());
  EXPECT(has(json, "\"rank\": null") && has(json, "\"fencing\": \"requested\""), "%s",
         json.c_str());
  EXPECT(has(json, "\"kokkos_interface_version\": 20210225"), "%s", json.c_str());

  // The table: the note on fencing, the three kernels with the most time in order,
  // then the regions; the rest counted.
  EXPECT(has(table, "cubelm kernel timer: pid " + pid + ", "), "%s", table.c_str());
  EXPECT(has(table, "Kokkos fences") && has(table, "CUDA_LAUNCH_BLOCKING=1"), "%s", table.c_str());
  EXPECT(has(table, "kernels: 10 launches of 8 kernels"), "%s", table.c_str());
  const auto at_sleep = table.find("  test::sleep\n");
  const auto at_scan = table.find("  test::scan\n");
  const auto at_reduce = table.find("  test::reduce\n");
  const auto at_regions = table.find("regions, deep copies and fences");
  EXPECT(at_sleep < at_scan && at_scan < at_reduce && at_reduce < at_regions &&
             at_regions != std::string::npos,
         "%s", table.c_str());
  EXPECT(has(table, "... 5 more") && !has(table, "cubelm::adamw"), "%s", table.c_str());
  EXPECT(table.find("  test::outer\n") > at_regions &&
             table.find("  test::outer\n") != std::string::npos,
         "%s", table.c_str());
  EXPECT(has(table, "warning: 3 end or pop callbacks"), "%s", table.c_str());

  if (failures != 0) {
    std::printf("kernel_timer_hooks: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("%s", table.c_str());
  std::printf("kernel_timer_hooks: ok\n");
  return 0;
}
