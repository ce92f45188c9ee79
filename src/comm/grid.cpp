#include "cubelm/comm/grid.hpp"

#include "cubelm/core/error.hpp"

namespace cubelm::comm {

ProcessGrid::ProcessGrid(const Layout& layout, const Communicator& world, CommOptions options)
    : layout_(layout), traffic_(std::make_shared<TrafficCounters>()) {
  layout_.validate_for_world(world.size());
  coords_ = coords_of(layout_, world.rank());
  const GridCoords& g = coords_;
  // Every rank performs the same splits in the same order (MPI_Comm_split is collective).
  world_.emplace("world", Communicator::duplicate(world.raw()), traffic_, options);
  // The metrics' own exchange: counters of its own, so that it is not model traffic.
  metrics_.emplace("metrics", Communicator::duplicate(world.raw()),
                   std::make_shared<TrafficCounters>(), options);
  const std::pair<const char*, std::optional<Group>*> slots[] = {
      {"tp", &tp_},          {"dp", &dp_},          {"pp", &pp_},         {"pp.ends", &embedding_},
      {"cp", &cp_},          {"ep", &ep_},          {"edp", &edp_},       {"tp.row", &row_},
      {"tp.col", &col_},     {"tp.a", &axis_[0]},   {"tp.b", &axis_[1]},  {"tp.c", &axis_[2]},
      {"tp.ab", &plane_[0]}, {"tp.bc", &plane_[1]}, {"tp.ca", &plane_[2]}};
  for (const Membership& m : memberships(layout_, g)) {
    std::optional<Group>* slot = nullptr;
    for (const auto& [name, where] : slots)
      if (std::string(name) == m.name)
        slot = where;
    CUBELM_ASSERT(slot != nullptr, std::string("the grid has no slot for group ") + m.name);
    slot->emplace(m.name, world.split(m.color, m.key), traffic_, options);
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
