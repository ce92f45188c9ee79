#include "cubelm/comm/grid.hpp"

#include "cubelm/core/error.hpp"

namespace cubelm::comm {

ProcessGrid::ProcessGrid(const Layout& layout, const Communicator& world, CommOptions options)
    : layout_(layout), traffic_(std::make_shared<TrafficCounters>()) {
  layout_.validate_for_world(world.size());
  coords_ = coords_of(layout_, world.rank());
  const GridCoords& g = coords_;
  const int tp_block = g.world / layout_.tp; // which tp group: c + cp*(d + dp*s)
  const int replicas = layout_.replicas();
  auto make = [&](const char* name, int color, int key) {
    return Group(name, world.split(color, key), traffic_, options);
  };
  // Every rank performs the same splits in the same order (MPI_Comm_split is collective).
  world_.emplace("world", Communicator::duplicate(world.raw()), traffic_, options);
  // The metrics' own exchange: counters of its own, so that it is not model traffic.
  metrics_.emplace("metrics", Communicator::duplicate(world.raw()),
                   std::make_shared<TrafficCounters>(), options);
  tp_.emplace(make("tp", tp_block, g.tp));
  // dp: the replicas of the stage's parameters, every (c, d) of one (t, s).
  dp_.emplace(make("dp", g.tp + layout_.tp * g.pp, g.replica));
  pp_.emplace(make("pp", g.tp + layout_.tp * g.replica, g.pp));
  // The first and last stage of one pipeline (same t, c and d) pair up, first
  // stage first; every other rank, and every rank when pp == 1, is alone (a
  // colour of its own past the colours of the pairs).
  const int last = layout_.pp - 1;
  const bool at_an_end = last > 0 && (g.pp == 0 || g.pp == last);
  embedding_.emplace(
      make("pp.ends", at_an_end ? g.tp + layout_.tp * g.replica : layout_.tp * replicas + g.world,
           g.pp));
  if (layout_.cp > 1) // same t, d and s, ordered by c
    cp_.emplace(make("cp", g.tp + layout_.tp * (g.dp + layout_.dp * g.pp), g.cp));
  if (layout_.ep > 1) {
    ep_.emplace(make("ep", ep_color(layout_, g), g.ep));
    edp_.emplace(make("edp", edp_color(layout_, g), g.edp));
  }
  const int q = layout_.side();
  if (layout_.mode == TensorMode::d2) {
    row_.emplace(make("tp.row", tp_block * q + g.row, g.col));
    col_.emplace(make("tp.col", tp_block * q + g.col, g.row));
  } else if (layout_.mode == TensorMode::d3) {
    const int plane_base = tp_block * q * q;
    axis_[0].emplace(make("tp.a", plane_base + g.b + q * g.c, g.a));
    axis_[1].emplace(make("tp.b", plane_base + g.a + q * g.c, g.b));
    axis_[2].emplace(make("tp.c", plane_base + g.a + q * g.b, g.c));
    plane_[0].emplace(make("tp.ab", tp_block * q + g.c, g.a + q * g.b));
    plane_[1].emplace(make("tp.bc", tp_block * q + g.a, g.b + q * g.c));
    plane_[2].emplace(make("tp.ca", tp_block * q + g.b, g.c + q * g.a));
  }
  // Every NCCL communicator now, in the same order on every rank, rather than on each
  // group's first device collective inside a step: creating one is collective, can
  // take seconds, and ranks reaching two groups in different orders would deadlock.
  // world and metrics carry host memory only (the step's sums, the timings).
  for (const std::optional<Group>* g :
       {&tp_, &row_, &col_, &axis_[0], &axis_[1], &axis_[2], &plane_[0], &plane_[1], &plane_[2],
        &cp_, &dp_, &pp_, &embedding_, &ep_, &edp_})
    if (g->has_value())
      (*g)->connect_device();
}

std::vector<std::string> ProcessGrid::group_names() const {
  std::vector<std::string> names;
  for (const std::optional<Group>* g :
       {&world_, &tp_, &row_, &col_, &axis_[0], &axis_[1], &axis_[2], &plane_[0], &plane_[1],
        &plane_[2], &cp_, &dp_, &pp_, &embedding_, &ep_, &edp_})
    if (g->has_value())
      names.push_back((*g)->name());
  return names;
}

const Group& ProcessGrid::need(const std::optional<Group>& group, const char* what) const {
  CUBELM_ASSERT(group.has_value(),
                std::string(what) + " does not exist in tensor mode " + mode_name(layout_.mode));
  return *group;
}

const Group& ProcessGrid::ep() const {
  CUBELM_ASSERT(ep_.has_value(), "the ep group exists only with parallel.expert_size > 1");
  return *ep_;
}

const Group& ProcessGrid::cp() const {
  CUBELM_ASSERT(cp_.has_value(), "the cp group exists only with parallel.context_size > 1");
  return *cp_;
}

const Group& ProcessGrid::tp_row() const {
  return need(row_, "tp.row");
}
const Group& ProcessGrid::tp_col() const {
  return need(col_, "tp.col");
}
const Group& ProcessGrid::tp_axis(Axis axis) const {
  return need(axis_[static_cast<int>(axis)], "a tp axis group");
}
const Group& ProcessGrid::tp_plane(Plane plane) const {
  return need(plane_[static_cast<int>(plane)], "a tp plane group");
}

} // namespace cubelm::comm
