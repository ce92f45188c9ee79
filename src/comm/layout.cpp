#include "cubelm/comm/layout.hpp"

#include "cubelm/core/error.hpp"

#include <sstream>
#include <vector>

namespace cubelm::comm {

Layout layout_of(const ParallelConfig& parallel) {
  Layout l;
  l.dp = parallel.data_size;
  l.pp = parallel.pipeline_size;
  l.tp = parallel.tensor_size;
  l.mode = parallel.tensor_mode;
  l.sequence_parallel = parallel.sequence_parallel;
  l.ep = parallel.expert_size;
  l.etp = parallel.expert_tensor_size;
  l.cp = parallel.context_size;
  return l;
}

bool splits_sequences(TensorMode mode) {
  return mode == TensorMode::d1;
}

namespace {

int exponent_of(TensorMode mode) {
  return mode == TensorMode::d2 ? 2 : mode == TensorMode::d3 ? 3 : 1;
}

int power(int base, int exp) {
  int r = 1;
  for (int i = 0; i < exp; ++i)
    r *= base;
  return r;
}

// The integer root of `n` for the mode's exponent, or 0 when n is not a power.
int exact_root(int n, int exp) {
  for (int q = 1; power(q, exp) <= n; ++q)
    if (power(q, exp) == n)
      return q;
  return 0;
}

bool fits_mode(int tp, TensorMode mode) {
  if (tp < 1)
    return false;
  if (mode == TensorMode::none)
    return tp == 1;
  return exact_root(tp, exponent_of(mode)) > 0;
}

std::string power_label(int q, int exp) {
  std::string s = std::to_string(q);
  for (int i = 1; i < exp; ++i)
    s += "x" + std::to_string(q);
  return s;
}

// The valid sizes just below and just above `tp` for a 2d or 3d grid.
std::string nearest_powers(int tp, int exp) {
  int q = 1;
  while (power(q + 1, exp) <= tp)
    ++q;
  std::ostringstream out;
  out << power(q, exp) << " (" << power_label(q, exp) << ") or " << power(q + 1, exp) << " ("
      << power_label(q + 1, exp) << ")";
  return out.str();
}

[[noreturn]] void refuse(const std::string& message) {
  throw Error(message, true);
}

} // namespace

int Layout::side() const {
  if (mode == TensorMode::none)
    return 1;
  const int q = exact_root(tp, exponent_of(mode));
  CUBELM_ASSERT(q > 0, "Layout::side on a layout that was not validated");
  return q;
}

std::string Layout::describe() const {
  std::ostringstream out;
  out << "tp=" << mode_name(mode) << ":" << tp << (sequence_parallel ? "+sp" : "") << " pp=" << pp
      << " dp=" << dp;
  if (cp > 1)
    out << " cp=" << cp;
  if (ep > 1)
    out << " ep=" << ep;
  if (etp > 1)
    out << " etp=" << etp;
  return out.str();
}

void Layout::validate() const {
  const std::pair<const char*, int> sizes[] = {
      {"data_size", dp}, {"pipeline_size", pp}, {"tensor_size", tp}, {"context_size", cp}};
  for (const auto& [key, value] : sizes)
    if (value < 1)
      refuse(std::string("parallel.") + key + " = " + std::to_string(value) +
             ": a grid dimension must be at least 1");
  if (etp != 1 && etp != tp)
    refuse("parallel.expert_tensor_size = " + std::to_string(etp) +
           ": the experts' hidden layers split over all the tensor ranks or none, so it must be "
           "1 or tensor_size = " +
           std::to_string(tp));
  if (etp > 1 && (ep < 1 || replicas() % ep != 0)) {
    std::string valid;
    for (int r = 1; r <= replicas(); ++r)
      if (replicas() % r == 0)
        valid += (valid.empty() ? "" : ", ") + std::to_string(r);
    refuse("parallel.expert_size = " + std::to_string(ep) +
           ": with expert_tensor_size = tensor_size the expert-parallel groups are carved out of "
           "the replicas of the parameters, so expert_size must divide data_size x "
           "context_size = " +
           std::to_string(replicas()) + " (valid: " + valid + ")");
  }
  if (etp == 1 && (ep < 1 || (ep > 1 && (ep % tp != 0 || replicas() % (ep / tp) != 0)))) {
    // The valid sizes: tp times the divisors of the replicas.
    std::string valid;
    for (int r = 1; r <= replicas(); ++r)
      if (replicas() % r == 0)
        valid += (valid.empty() ? "" : ", ") + std::to_string(tp * r);
    refuse("parallel.expert_size = " + std::to_string(ep) +
           ": the expert-parallel groups fold the tensor-parallel ranks and some of the "
           "replicas of the parameters, so expert_size must be tensor_size = " +
           std::to_string(tp) + " times a divisor of data_size x context_size = " +
           std::to_string(replicas()) + " (valid: 1, " + valid + ")");
  }
  switch (mode) {
  case TensorMode::none:
    if (tp != 1)
      refuse("parallel.tensor_mode = \"none\" needs parallel.tensor_size = 1, got " +
             std::to_string(tp) +
             "; use tensor_mode = \"1d\" (any size), \"2d\" (a square) or "
             "\"3d\" (a cube) for tensor parallelism");
    break;
  case TensorMode::d1:
    break;
  case TensorMode::d2:
    if (!fits_mode(tp, mode))
      refuse("parallel.tensor_mode = \"2d\" needs a square parallel.tensor_size = q*q, got " +
             std::to_string(tp) + "; nearest valid values: " + nearest_powers(tp, 2));
    break;
  case TensorMode::d3:
    if (!fits_mode(tp, mode))
      refuse("parallel.tensor_mode = \"3d\" needs a cube parallel.tensor_size = q*q*q, got " +
             std::to_string(tp) + "; nearest valid values: " + nearest_powers(tp, 3));
    break;
  }
}

void Layout::validate_for_world(int world_size) const {
  validate();
  if (world_size == this->world_size())
    return;
  std::ostringstream out;
  out << "the job has " << world_size << " processes but the layout " << describe() << " needs "
      << "data_size x pipeline_size x " << (cp > 1 ? "context_size x " : "")
      << "tensor_size = " << dp << " x " << pp << " x "
      << (cp > 1 ? std::to_string(cp) + " x " : "") << tp << " = " << this->world_size()
      << ". Launch with " << this->world_size() << " processes (mpiexec -n " << this->world_size()
      << ")";
  std::vector<std::string> options;
  if (world_size % (tp * pp * cp) == 0)
    options.push_back("data_size = " + std::to_string(world_size / (tp * pp * cp)));
  if (world_size % (tp * dp * cp) == 0)
    options.push_back("pipeline_size = " + std::to_string(world_size / (tp * dp * cp)));
  if (world_size % (dp * pp * cp) == 0 && fits_mode(world_size / (dp * pp * cp), mode))
    options.push_back("tensor_size = " + std::to_string(world_size / (dp * pp * cp)));
  if (cp > 1 && world_size % (tp * pp * dp) == 0)
    options.push_back("context_size = " + std::to_string(world_size / (tp * pp * dp)));
  if (!options.empty()) {
    out << ", or change one size to fit " << world_size << " processes: ";
    for (std::size_t i = 0; i < options.size(); ++i)
      out << (i == 0 ? "" : "; ") << options[i];
  }
  refuse(out.str());
}

int stage_of(const ParallelConfig& parallel, int world_rank) {
  return coords_of(layout_of(parallel), world_rank).pp;
}

GridCoords coords_of(const Layout& layout, int world_rank) {
  CUBELM_ASSERT(world_rank >= 0 && world_rank < layout.world_size(),
                "rank " + std::to_string(world_rank) + " outside the grid " + layout.describe());
  GridCoords g;
  g.world = world_rank;
  g.tp = world_rank % layout.tp;
  g.cp = (world_rank / layout.tp) % layout.cp;
  g.dp = (world_rank / (layout.tp * layout.cp)) % layout.dp;
  g.pp = world_rank / (layout.tp * layout.cp * layout.dp);
  g.replica = g.cp + layout.cp * g.dp;
  const int q = layout.side();
  if (layout.mode == TensorMode::d2) {
    g.row = g.tp / q;
    g.col = g.tp % q;
  } else if (layout.mode == TensorMode::d3) {
    g.a = g.tp % q;
    g.b = (g.tp / q) % q;
    g.c = g.tp / (q * q);
  }
  const int fold = layout.expert_replicas();
  if (layout.ep > 1)
    g.ep = layout.etp > 1 ? g.replica % fold : g.tp + layout.tp * (g.replica % fold);
  g.edp = g.replica / fold;
  return g;
}

int ep_color(const Layout& layout, const GridCoords& g) {
  // Same s and r = replica / expert_replicas(), every t (with expert tensor parallelism
  // the same t).
  const int t = layout.etp > 1 ? g.tp : 0;
  return g.pp + layout.pp * (g.edp + layout.expert_copies() * t);
}

int edp_color(const Layout& layout, const GridCoords& g) {
  // Same s and index e in ep (with expert tensor parallelism the same t).
  const int t = layout.etp > 1 ? g.tp : 0;
  return g.pp + layout.pp * (g.ep + layout.ep * t);
}

std::vector<Membership> memberships(const Layout& layout, const GridCoords& g) {
  const int tp_block = g.world / layout.tp; // which tp group: c + cp*(d + dp*s)
  std::vector<Membership> out = {
      {"tp", tp_block, g.tp},
      // dp: the replicas of the stage's parameters, every (c, d) of one (t, s).
      {"dp", g.tp + layout.tp * g.pp, g.replica},
      {"pp", g.tp + layout.tp * g.replica, g.pp}};
  // The first and last stage of one pipeline (same t, c and d) pair up, first stage
  // first; every other rank, and every rank when pp == 1, is alone (a colour of its own
  // past the colours of the pairs).
  const int last = layout.pp - 1;
  const bool at_an_end = last > 0 && (g.pp == 0 || g.pp == last);
  out.push_back({"pp.ends",
                 at_an_end ? g.tp + layout.tp * g.replica : layout.tp * layout.replicas() + g.world,
                 g.pp});
  if (layout.cp > 1) // same t, d and s, ordered by c
    out.push_back({"cp", g.tp + layout.tp * (g.dp + layout.dp * g.pp), g.cp});
  if (layout.ep > 1) {
    out.push_back({"ep", ep_color(layout, g), g.ep});
    out.push_back({"edp", edp_color(layout, g), g.edp});
  }
  const int q = layout.side();
  if (layout.mode == TensorMode::d2) {
    out.push_back({"tp.row", tp_block * q + g.row, g.col});
    out.push_back({"tp.col", tp_block * q + g.col, g.row});
  } else if (layout.mode == TensorMode::d3) {
    const int plane_base = tp_block * q * q;
    out.push_back({"tp.a", plane_base + g.b + q * g.c, g.a});
    out.push_back({"tp.b", plane_base + g.a + q * g.c, g.b});
    out.push_back({"tp.c", plane_base + g.a + q * g.b, g.c});
    out.push_back({"tp.ab", tp_block * q + g.c, g.a + q * g.b});
    out.push_back({"tp.bc", tp_block * q + g.a, g.b + q * g.c});
    out.push_back({"tp.ca", tp_block * q + g.b, g.c + q * g.a});
  }
  return out;
}

std::vector<int> tensor_sizes(TensorMode mode, int ranks) {
  if (mode == TensorMode::none)
    return {1};
  std::vector<int> out;
  const int exp = exponent_of(mode);
  for (int q = 2, size = power(q, exp); size <= ranks; size = power(++q, exp))
    if (ranks % size == 0)
      out.push_back(size);
  return out;
}

int world_rank_of(const Layout& layout, int dp, int pp, int tp, int cp) {
  return tp + layout.tp * (cp + layout.cp * (dp + layout.dp * pp));
}

int tp_rank_3d(int q, int a, int b, int c) {
  return a + q * (b + q * c);
}

} // namespace cubelm::comm
