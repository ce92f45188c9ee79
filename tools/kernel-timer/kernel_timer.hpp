#pragma once
// The figures of libcubelm_kernel_timer (docs/kernels.md, "Timing kernels") and
// their reports. Plain C++17 and the standard library only: the library is
// loaded into a Kokkos program at run time and links nothing of Kokkos, MPI or
// CUDA. The Kokkos Tools entry points are in hooks.cpp.

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::kernel_timer {

/// \brief What an interval is: a kernel (one of Kokkos' parallel patterns) or
/// something that may hold kernels (a region, a deep copy, a fence).
enum class Kind { parallel_for, parallel_reduce, parallel_scan, region, deep_copy, fence };

/// \brief Whether intervals of this kind are kernels: they never hold each other, so
/// their times add up to the device's busy time.
bool is_kernel(Kind kind);

/// \brief "parallel_for", "region", ... (the JSON's "kind").
const char* kind_name(Kind kind);

/// \brief "for", "region", ... (the table's narrow column).
const char* kind_short(Kind kind);

/// \brief calls, total, min and max seconds of one name.
struct Stat {
  std::uint64_t calls = 0;
  double total_s = 0;
  double min_s = 0;
  double max_s = 0;

  void add(double seconds);
};

/// \brief One row of the reports: what Kokkos named, and its figures.
struct Entry {
  Kind kind;
  std::string raw_name; ///< as Kokkos passed it
  std::string name;     ///< demangled and shortened (display_name)
  Stat stat;
};

/// \brief How the device was synchronised around the kernels, for the note in the
/// reports' header.
enum class Fencing {
  requested,   ///< Kokkos fences before every begin and end callback (the default)
  declined,    ///< CUBELM_KERNEL_TIMER_FENCE=0: no fences, launches are asynchronous
  unannounced, ///< Kokkos never asked the library (not Kokkos 3.4 or later?)
};

/// \brief Everything a report says, collected when Kokkos finalizes.
struct Report {
  std::vector<Entry> entries; ///< in any order; the writers sort them
  double wall_s = 0;          ///< from the library's initialisation to the report
  long pid = 0;
  std::string rank; ///< from the launcher's environment; empty when none
  std::uint64_t interface_version = 0;
  Fencing fencing = Fencing::unannounced;
  std::uint64_t tool_fences = 0; ///< fences Kokkos made for this library, not timed
  std::uint64_t unmatched = 0;   ///< end callbacks without a begin, pops without a push
  bool finalized = true;         ///< false when written at exit without Kokkos::finalize
};

/// \brief A kernel name as a reader wants it: typeid names (`N6cubelm3FooE`,
/// `ZN6cubelm3runEvEUliE_`) demangled, each part of a `functor/tag` name on its own,
/// `(anonymous namespace)::` dropped, and template and function arguments collapsed
/// to `<...>` and `(...)`. Labels given by the program come back unchanged.
std::string display_name(const std::string& raw);

/// \brief Whether `s` looks like a mangled C++ name or typeid name (and not a label).
bool looks_mangled(const std::string& s);

/// \brief The rank from OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or SLURM_PROCID
/// (the first set), or an empty string.
std::string rank_from_environment();

/// \brief `path.<rank>` when the rank is known, `path.<pid>` otherwise: one file per
/// process.
std::string per_process_path(const std::string& path, const std::string& rank, long pid);

/// \brief The table: the header with the note on fencing, the `top` kernels by total
/// time, then the `top` regions, copies and fences.
std::string format_table(const Report& report, std::size_t top);

/// \brief The same figures as JSON, every entry (not only the top ones).
std::string format_json(const Report& report);

} // namespace cubelm::kernel_timer
