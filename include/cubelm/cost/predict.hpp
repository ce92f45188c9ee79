#pragma once
/// \file
/// \brief The step time, memory and traffic of a deck's layout on a machine, predicted
/// without running anything (docs/planner.md): `cubelm plan` ranks layouts by it and
/// `cubelm check --machine` prints it for the deck's own layout.
///
/// Memory and bytes are the exact closed forms (cost/memory.hpp, cost/traffic.hpp),
/// equal to what a run allocates and counts. The time is a model:
///  - compute: the model's FLOPs of each pass at the machine's gemm rate for the deck's
///    precision, plus the non-gemm kernels' memory traffic at its memory bandwidth;
///  - communication: every tensor-parallel collective blocks (alpha-beta cost at the
///    network level its group spans, bandwidth shared by the groups leaving a node at
///    once); pipeline messages delay the receiving pass; data-parallel buckets overlap the
///    backward passes from the moment their gradients are complete;
///  - the pipeline: the schedule's timeline with these costs (pipeline/timed.hpp).
/// No Kokkos, no MPI.

#include "cubelm/comm/layout.hpp"
#include "cubelm/comm/traffic.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/cost/traffic.hpp"
#include "cubelm/io/machine.hpp"

#include <map>
#include <string>
#include <vector>

namespace cubelm::cost {

/// \brief How the instances of one group of the grid sit on the machine's nodes.
struct GroupPlacement {
  int ranks = 1;      ///< ranks in one instance
  bool inter = false; ///< some instance spans more than one node
  int sharing = 1;    ///< most instances leaving one node at once (they share its links)
};

/// \brief Every group of `layout` (the names of comm::ProcessGrid and the counters:
/// "tp", "tp.row", ..., "dp", "pp.ends", "world") placed on nodes of `devices_per_node`
/// ranks, world ranks in order (docs/grid.md: tp fastest, then dp, then pp). For "pp",
/// the message from stage s to s + 1 (mod p) is "pp>" followed by s.
std::map<std::string, GroupPlacement> place_groups(const comm::Layout& layout,
                                                   int devices_per_node);

/// \brief Seconds that `calls` calls of `kind` take on a group placed as `where` when
/// this rank sends `bytes` in all (the counters' bytes): bytes over the level's
/// bandwidth (between nodes: the node's, shared by `where.sharing` groups, and never more
/// than a device's inside the node) plus one latency per step of the ring (2 log2 p per
/// all-reduce, whose small messages take a tree; p - 1 per gather, scatter, broadcast or
/// reduce; 1 per send).
double collective_seconds(comm::Kind kind, const GroupPlacement& where, double calls, double bytes,
                          const io::Machine& machine);

/// \brief What a layout costs on a machine.
struct Prediction {
  double step_s = 0;    ///< one optimizer step
  double compute_s = 0; ///< the critical stage's passes without their communication
  double idle_s = 0;    ///< its waiting for other stages (bubble and messages)
  double optimizer_s = 0;
  std::map<std::string, double> comm_s; ///< exposed communication by group
  int critical_stage = 0;               ///< the stage that ends the step last
  double model_flops = 0;               ///< per step, all ranks (6 N + 12 L H T per token)
  double tokens = 0;                    ///< per step
  double tflops_per_device = 0;         ///< model FLOPs / step / ranks
  double mfu = 0;                       ///< against the peak of the deck's precision

  std::vector<Memory> stage_memory;                      ///< [stage], per rank
  Memory memory;                                         ///< the fullest stage's
  bool fits = true;                                      ///< memory.total() <= the device's
  std::vector<std::vector<TrafficVolume>> stage_traffic; ///< [stage], per rank per step
  double comm_bytes = 0;                                 ///< rank 0's (stage 0)
  std::vector<double> unit_bubble; ///< [stage]: idle / busy of the unit-cost timeline

  double checkpoint_bytes = 0; ///< one save's file (checkpoint_bytes)
  /// One save's write time at machine.checkpoint_gbs; 0 when the machine file has none.
  double checkpoint_s = 0;
  /// checkpoint_s spread over the steps of one checkpoint.interval (over train.steps when
  /// the deck saves only at the end): part of step_s.
  double checkpoint_step_s = 0;

  /// \brief The sum of comm_s.
  double exposed_comm_s() const;
};

/// \brief The steps one save's time is spread over: checkpoint.interval, or train.steps for a
/// deck that saves only at the end (at least 1).
int steps_per_save(const Deck& deck);

/// \brief How predict() may save work when it is called for thousands of layouts.
struct PredictOptions {
  /// place_groups(layout, machine.devices_per_node), when the caller keeps them.
  const std::map<std::string, GroupPlacement>* placement = nullptr;
  /// Stop after the memory when the layout does not fit (step_s stays 0).
  bool memory_first = false;
};

/// \brief Predicts `deck`'s layout on `machine` (the deck must be valid: cost::parse_deck's
/// rules, or planner::layouts).
Prediction predict(const Deck& deck, const io::Machine& machine,
                   const PredictOptions& options = {});

} // namespace cubelm::cost
