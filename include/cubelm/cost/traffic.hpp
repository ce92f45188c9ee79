#pragma once
/// \file
/// \brief Closed forms of the bytes a rank sends in one training step, per group and
/// kind, in the cost model of docs/communication.md: what the traffic counters count,
/// computed from the deck alone (no allocation, no MPI, no Kokkos).

#include "cubelm/comm/traffic.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/pipeline/schedule.hpp"
#include "cubelm/tp/collectives.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::cost {

/// \brief Calls and modelled bytes of one (group, kind) in one step.
struct TrafficVolume {
  std::string group;
  comm::Kind kind = comm::Kind::all_reduce;
  std::uint64_t calls = 0;
  double bytes = 0;
};

/// \brief Every (group, kind) a rank of pipeline stage `stage` sends on in one step of
/// `deck`, sorted by group then kind like TrafficCounters::entries(): the tensor-parallel
/// mode's collectives of the stage's layers, embedding lookup and head (recomputation
/// repeats each layer's forward ones), the pipeline's messages, the tied embedding's
/// gradient over pp.ends, the data-parallel gradient buckets (all-reduced, or
/// reduce-scattered and the parameters all-gathered with ZeRO-1), and the step's sums
/// over world. Equal to what the counters of such a rank count (every rank of a
/// stage counts the same).
std::vector<TrafficVolume> traffic_per_step(const Deck& deck, int stage = 0);
/// \brief The same with the deck's pipeline plan made already (pipeline::make_plan).
std::vector<TrafficVolume> traffic_per_step(const Deck& deck, const pipeline::PipelinePlan& plan,
                                            int stage);

/// \brief What one micro-batch runs on a rank: the lookup, the head (ln_f, logits, loss),
/// layers forward and backward, and layers whose forward runs again in the backward.
struct UnitWork {
  bool lookup = false, head = false;
  double layers = 0, recomputed = 0;
  /// of `layers` and `recomputed`: those with an MoE feed-forward (no MLP collectives)
  double moe = 0, moe_recomputed = 0;
};

/// \brief The tensor-parallel collectives of `pass` (the forward of every layer in `work`,
/// recomputed ones too, or their backward) for one micro-batch in `deck`'s layout (the part
/// of traffic_per_step that the tensor-parallel mode sends), so that the predictor can time
/// each pass.
std::vector<TrafficVolume> tensor_parallel_traffic(const Deck& deck, const UnitWork& work,
                                                   tp::Pass pass);

/// \brief The sum of the bytes of traffic_per_step: the metrics' comm_bytes.
double comm_bytes_per_step(const Deck& deck, int stage = 0);

} // namespace cubelm::cost
