#include "cubelm/core/placement.hpp"

#include <Kokkos_Macros.hpp>
#include <sched.h>

#ifdef KOKKOS_ENABLE_OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>
#include <string>

namespace cubelm {

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0)
    return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set))
      cpus.push_back(c);
  return cpus;
}

std::vector<int> launch_cpus() {
#ifdef KOKKOS_ENABLE_OPENMP
  const int places = omp_get_num_places();
  if (places > 0) {
    std::vector<int> cpus;
    for (int p = 0; p < places; ++p) {
      std::vector<int> ids(static_cast<std::size_t>(omp_get_place_num_procs(p)));
      omp_get_place_proc_ids(p, ids.data());
      cpus.insert(cpus.end(), ids.begin(), ids.end());
    }
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    return cpus;
  }
#endif
  return allowed_cpus();
}

bool restore_launch_affinity() {
  const std::vector<int> cpus = launch_cpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE)
      CPU_SET(c, &set);
  return CPU_COUNT(&set) > 0 && sched_setaffinity(0, sizeof(set), &set) == 0;
}

bool openmp_pins_threads() {
  const char* bind = std::getenv("OMP_PROC_BIND");
  if (bind == nullptr || *bind == '\0') {
    // OpenMP implementations bind when places are given without a policy.
    const char* places = std::getenv("OMP_PLACES");
    return places != nullptr && *places != '\0';
  }
  std::string v(bind);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return v != "false";
}

bool mpi_yields_when_idle() {
  const char* v = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  return v != nullptr && (std::string(v) == "1" || std::string(v) == "true");
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string s;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1)
      ++j;
    if (!s.empty())
      s += ',';
    s += std::to_string(cpus[i]);
    if (j > i)
      s += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

namespace {

std::vector<int> overlap(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return both;
}

std::string plural(long n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string cpus_named(const std::vector<int>& cpus) {
  return (cpus.size() == 1 ? "CPU " : "CPUs ") + cpu_list(cpus);
}

} // namespace

std::vector<std::string> placement_warnings(const std::vector<RankPlacement>& node,
                                            const std::string& host) {
  std::vector<std::string> out;
  if (node.empty())
    return out;
  std::set<int> all;
  long threads = 0;
  bool single_threaded = true, yield = true;
  for (const RankPlacement& r : node) {
    all.insert(r.cpus.begin(), r.cpus.end());
    threads += r.threads;
    single_threaded = single_threaded && r.threads == 1;
    yield = yield && r.yields;
  }
  const long ranks = static_cast<long>(node.size());
  const long cores = static_cast<long>(all.size());
  const std::string where = host + ": ";
  const long fair = std::max(1L, cores / ranks);

  const bool oversubscribed = threads > cores;
  if (oversubscribed && single_threaded && yield) {
    out.push_back(where + plural(ranks, "rank shares ", "ranks share ") +
                  plural(cores, "CPU", "CPUs") +
                  " (oversubscribed; waiting ranks yield their core): each runs on a fraction of "
                  "a core. Fine for tests; for speed run at most one rank per core.");
  } else if (oversubscribed && single_threaded) {
    out.push_back(where + plural(ranks, "rank shares ", "ranks share ") +
                  plural(cores, "CPU", "CPUs") +
                  " (oversubscribed) and MPI busy-polls while it waits, taking the core from the "
                  "rank that has work. With Open MPI set OMPI_MCA_mpi_yield_when_idle=1 "
                  "(scripts/run does), or run at most one rank per core.");
  } else if (oversubscribed) {
    out.push_back(where + plural(ranks, "rank runs ", "ranks run ") + std::to_string(threads) +
                  " threads in all on " + plural(cores, "CPU", "CPUs") +
                  ", so threads share cores and spin against each other. Give each rank " +
                  std::to_string(fair) + " thread" + (fair == 1 ? "" : "s") +
                  " (OMP_NUM_THREADS or --kokkos-num-threads) and cores of its own (mpiexec "
                  "--map-by slot:PE=" +
                  std::to_string(fair) + " --bind-to core, or srun --cpus-per-task=" +
                  std::to_string(fair) + " --cpu-bind=cores); scripts/run does this.");
  } else {
    // Enough cores on the node, but a rank may be bound to fewer than it uses.
    std::string tight;
    int listed = 0;
    for (const RankPlacement& r : node) {
      if (r.threads <= static_cast<int>(r.cpus.size()))
        continue;
      if (listed++ < 4)
        tight += (tight.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r.rank) +
                 " runs " + std::to_string(r.threads) + " threads on " + cpus_named(r.cpus);
    }
    if (listed > 0)
      out.push_back(where + tight + (listed > 4 ? "; ..." : "") +
                    ". A rank bound to fewer cores than it has threads time-slices them: bind "
                    "each rank to as many cores as threads (mpiexec --map-by slot:PE=n --bind-to "
                    "core) or lower OMP_NUM_THREADS.");
  }

  // OpenMP places each rank's threads starting from the first CPU of its own
  // set: ranks whose sets overlap put their threads on the same cores.
  for (std::size_t a = 0; a < node.size(); ++a) {
    if (!node[a].pins_threads)
      continue;
    for (std::size_t b = a + 1; b < node.size(); ++b) {
      if (!node[b].pins_threads)
        continue;
      const std::vector<int> shared = overlap(node[a].cpus, node[b].cpus);
      if (shared.empty())
        continue;
      out.push_back(where + "OpenMP pins threads (OMP_PROC_BIND/OMP_PLACES) while ranks " +
                    std::to_string(node[a].rank) + " and " + std::to_string(node[b].rank) +
                    " may both run on " + cpus_named(shared) +
                    ": each rank pins its threads from the first CPU of its set, so they land on "
                    "the same cores. Bind each rank to cores of its own (mpiexec --map-by "
                    "slot:PE=" +
                    std::to_string(fair) + " --bind-to core) or set OMP_PROC_BIND=false.");
      return out;
    }
  }
  return out;
}

} // namespace cubelm
