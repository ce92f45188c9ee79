// Names, file names and the two reports of libcubelm_kernel_timer.

#include "kernel_timer.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace cubelm::kernel_timer {

bool is_kernel(Kind kind) {
  return kind == Kind::parallel_for || kind == Kind::parallel_reduce || kind == Kind::parallel_scan;
}

const char* kind_name(Kind kind) {
  switch (kind) {
  case Kind::parallel_for:
    return "parallel_for";
  case Kind::parallel_reduce:
    return "parallel_reduce";
  case Kind::parallel_scan:
    return "parallel_scan";
  case Kind::region:
    return "region";
  case Kind::deep_copy:
    return "deep_copy";
  case Kind::fence:
    return "fence";
  }
  return "?";
}

const char* kind_short(Kind kind) {
  switch (kind) {
  case Kind::parallel_for:
    return "for";
  case Kind::parallel_reduce:
    return "reduce";
  case Kind::parallel_scan:
    return "scan";
  case Kind::region:
    return "region";
  case Kind::deep_copy:
    return "copy";
  case Kind::fence:
    return "fence";
  }
  return "?";
}

void Stat::add(double seconds) {
  if (calls == 0 || seconds < min_s)
    min_s = seconds;
  if (calls == 0 || seconds > max_s)
    max_s = seconds;
  total_s += seconds;
  ++calls;
}

namespace {

bool is_digit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

// Replaces the contents of every outermost <...> and (...) with "...". Returns the
// input unchanged when the brackets do not balance (an `operator<` in the name).
std::string collapse_arguments(const std::string& s) {
  std::string out;
  std::string open; // the brackets entered, innermost last
  bool inside_empty = true;
  for (const char c : s) {
    if (c == '<' || c == '(') {
      if (open.empty()) {
        out += c;
        inside_empty = true;
      } else {
        inside_empty = false;
      }
      open += c;
    } else if (c == '>' || c == ')') {
      if (open.empty() || open.back() != (c == '>' ? '<' : '('))
        return s;
      open.pop_back();
      if (open.empty()) {
        if (!inside_empty)
          out += "...";
        out += c;
      } else {
        inside_empty = false;
      }
    } else if (open.empty()) {
      out += c;
    } else if (c != ' ') {
      inside_empty = false;
    }
  }
  return open.empty() ? out : s;
}

std::string drop_all(std::string s, const std::string& what) {
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at))
    s.erase(at, what.size());
  return s;
}

std::string demangle_part(const std::string& part) {
  if (!looks_mangled(part))
    return part;
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> text(
      abi::__cxa_demangle(part.c_str(), nullptr, nullptr, &status), std::free);
  if (status != 0 || !text)
    return part;
  return collapse_arguments(drop_all(text.get(), "(anonymous namespace)::"));
}

// Long names keep their start (the namespace) and their end (the lambda or functor).
std::string fit(const std::string& s, std::size_t width) {
  if (s.size() <= width)
    return s;
  const std::size_t head = width / 3;
  const std::size_t tail = width - head - 3;
  return s.substr(0, head) + "..." + s.substr(s.size() - tail);
}

std::string fixed(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buffer[8];
        std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(c));
        out += buffer;
      } else {
        out += c;
      }
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  return fixed("%.9g", value);
}

// The entries of one table (kernels, or the rest), the most time first; equal times
// by name, so that the order does not depend on the hash map's.
std::vector<const Entry*> sorted(const Report& report, bool kernels) {
  std::vector<const Entry*> rows;
  for (const Entry& e : report.entries)
    if (is_kernel(e.kind) == kernels)
      rows.push_back(&e);
  std::sort(rows.begin(), rows.end(), [](const Entry* a, const Entry* b) {
    if (a->stat.total_s != b->stat.total_s)
      return a->stat.total_s > b->stat.total_s;
    return a->name < b->name;
  });
  return rows;
}

double kernel_total(const Report& report) {
  double total = 0;
  for (const Entry& e : report.entries)
    if (is_kernel(e.kind))
      total += e.stat.total_s;
  return total;
}

std::uint64_t kernel_calls(const Report& report) {
  std::uint64_t calls = 0;
  for (const Entry& e : report.entries)
    if (is_kernel(e.kind))
      calls += e.stat.calls;
  return calls;
}

const char* fencing_note(Fencing fencing) {
  switch (fencing) {
  case Fencing::requested:
    return "note: each time is the host clock from a kernel's begin callback to its end callback.\n"
           "      Kokkos fences the device before every callback (global fencing, which this\n"
           "      library asks for), so on a GPU a kernel's time is its launch and its run, one\n"
           "      kernel at a time. Work outside Kokkos' patterns (cuBLAS, NCCL) counts only in a\n"
           "      region around it; CUDA_LAUNCH_BLOCKING=1 makes all of it synchronous too.\n";
  case Fencing::declined:
    return "note: CUBELM_KERNEL_TIMER_FENCE=0: Kokkos does not fence around kernels. On a GPU\n"
           "      launches are asynchronous, and these host times are launch times, not kernel\n"
           "      times, unless CUDA_LAUNCH_BLOCKING=1.\n";
  case Fencing::unannounced:
    break;
  }
  return "note: Kokkos did not negotiate fencing with this library (a Kokkos before 3.4?). On a\n"
         "      GPU launches are asynchronous: these host times are kernel times only with\n"
         "      CUDA_LAUNCH_BLOCKING=1.\n";
}

// Seconds as a reader wants them: "12.345 s" or "1.234 ms".
std::string duration(double s) {
  return s >= 1 ? fixed("%.3f s", s) : fixed("%.3f ms", s * 1e3);
}

std::string table_rows(const std::vector<const Entry*>& rows, std::size_t top, double share_of) {
  std::string out = "  kind        calls    total ms     mean us      min us      max us   share  "
                    "name\n";
  const std::size_t n = top == 0 ? rows.size() : std::min(top, rows.size());
  for (std::size_t i = 0; i < n; ++i) {
    const Entry& e = *rows[i];
    const Stat& s = e.stat;
    char line[256];
    std::snprintf(line, sizeof line, "  %-6s %10llu %11.3f %11.1f %11.1f %11.1f %6.1f%%  ",
                  kind_short(e.kind), static_cast<unsigned long long>(s.calls), s.total_s * 1e3,
                  s.calls ? s.total_s / static_cast<double>(s.calls) * 1e6 : 0.0, s.min_s * 1e6,
                  s.max_s * 1e6, share_of > 0 ? 100.0 * s.total_s / share_of : 0.0);
    out += line + fit(e.name, 100) + "\n";
  }
  if (n < rows.size())
    out += "  ... " + std::to_string(rows.size() - n) +
           " more (CUBELM_KERNEL_TIMER_TOP=0 lists all; the JSON has all)\n";
  return out;
}

std::string top_words(std::size_t top, std::size_t count) {
  if (top == 0 || top >= count)
    return "all " + std::to_string(count) + ", the most time first";
  return "the " + std::to_string(top) + " with the most time";
}

} // namespace

bool looks_mangled(const std::string& s) {
  if (s.size() < 2)
    return false;
  for (const char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.'))
      return false;
  // A symbol (_Z...), or what typeid(T).name() gives for a class: a nested name
  // (N...E), a local one such as a lambda (Z...E...), or a length-prefixed name.
  if (s[0] == '_' && s[1] == 'Z')
    return true;
  if ((s[0] == 'N' || s[0] == 'Z') && (is_digit(s[1]) || s[1] == 'N' || s[1] == 'Z' || s[1] == 'S'))
    return true;
  return is_digit(s[0]);
}

std::string display_name(const std::string& raw) {
  std::string out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t slash = raw.find('/', start);
    out += demangle_part(raw.substr(start, slash == std::string::npos ? slash : slash - start));
    if (slash == std::string::npos)
      return out;
    out += '/';
    start = slash + 1;
  }
}

std::string rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0')
      return value;
  }
  return "";
}

std::string per_process_path(const std::string& path, const std::string& rank, long pid) {
  return path + "." + (rank.empty() ? std::to_string(pid) : rank);
}

std::string format_table(const Report& report, std::size_t top) {
  const double kernels_s = kernel_total(report);
  const auto kernels = sorted(report, true);
  const auto others = sorted(report, false);

  std::string out = "cubelm kernel timer: ";
  out += report.rank.empty() ? "" : "rank " + report.rank + ", ";
  out += "pid " + std::to_string(report.pid) + ", " + duration(report.wall_s) +
         " from Kokkos' initialize to " +
         (report.finalized ? "its finalize" : "the exit (Kokkos::finalize was not reached)") + "\n";
  out += fencing_note(report.fencing);
  if (report.unmatched > 0)
    out += "warning: " + std::to_string(report.unmatched) +
           " end or pop callbacks without a begin or push were ignored\n";
  out += "kernels: " + std::to_string(kernel_calls(report)) + " launches of " +
         std::to_string(kernels.size()) + " kernels, " + duration(kernels_s) + " in all (" +
         fixed("%.1f", report.wall_s > 0 ? 100.0 * kernels_s / report.wall_s : 0.0) +
         "% of the run); " + top_words(top, kernels.size()) + ", share of the kernels' time:\n";
  out += table_rows(kernels, top, kernels_s);
  out += "regions, deep copies and fences (they hold kernels and each other): " +
         top_words(top, others.size()) + ", share of the run's time:\n";
  out += table_rows(others, top, report.wall_s);
  return out;
}

std::string format_json(const Report& report) {
  const double kernels_s = kernel_total(report);
  auto entries = [&](bool kernels, double share_of) {
    std::string out = "[";
    const auto rows = sorted(report, kernels);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Entry& e = *rows[i];
      const Stat& s = e.stat;
      out += i == 0 ? "\n  " : ",\n  ";
      out +=
          "{\"kind\": " + json_string(kind_name(e.kind)) + ", \"name\": " + json_string(e.name) +
          ", \"raw_name\": " + json_string(e.raw_name) + ", \"calls\": " + std::to_string(s.calls) +
          ", \"total_s\": " + json_number(s.total_s) +
          ", \"mean_s\": " + json_number(s.calls ? s.total_s / static_cast<double>(s.calls) : 0) +
          ", \"min_s\": " + json_number(s.min_s) + ", \"max_s\": " + json_number(s.max_s) +
          ", \"share\": " + json_number(share_of > 0 ? s.total_s / share_of : 0) + "}";
    }
    return out + (rows.empty() ? "]" : "\n]");
  };
  const char* fencing = report.fencing == Fencing::requested  ? "requested"
                        : report.fencing == Fencing::declined ? "declined"
                                                              : "unannounced";
  std::string out = "{\"tool\": \"cubelm_kernel_timer\", \"pid\": " + std::to_string(report.pid);
  out += ", \"rank\": " + (report.rank.empty() ? std::string("null") : json_string(report.rank));
  out += ", \"wall_s\": " + json_number(report.wall_s);
  out += ", \"kernel_total_s\": " + json_number(kernels_s);
  out += ", \"kernel_calls\": " + std::to_string(kernel_calls(report));
  out += ", \"kokkos_interface_version\": " + std::to_string(report.interface_version);
  out += ", \"fencing\": " + json_string(fencing);
  out += ", \"finalized\": " + std::string(report.finalized ? "true" : "false");
  out += ", \"tool_fences\": " + std::to_string(report.tool_fences);
  out += ", \"unmatched\": " + std::to_string(report.unmatched);
  out += ",\n\"kernels\": " + entries(true, kernels_s);
  out += ",\n\"regions\": " + entries(false, report.wall_s);
  return out + "}\n";
}

} // namespace cubelm::kernel_timer
