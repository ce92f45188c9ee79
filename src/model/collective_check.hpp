#pragma once
// A debug check that each piece of the model issues, on the tensor-parallel groups, the
// collectives tp/collectives.hpp describes for it: with CUBELM_CHECK_COLLECTIVES=1 the
// model reads the traffic counters around each piece's forward and backward and compares
// the calls and modelled bytes of every (group, kind) with the description's. A mismatch
// is an internal error naming the piece, the pass, the group and the kind. Internal to
// src/model.

#include "cubelm/comm/traffic.hpp"
#include "cubelm/core/config.hpp"
#include "cubelm/tp/collectives.hpp"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>

namespace cubelm::model::detail {

class CollectiveCheck {
public:
  /// Off unless CUBELM_CHECK_COLLECTIVES is set (and not "0"); `tokens`: a micro-batch's
  /// tokens on this rank's tensor-parallel group.
  CollectiveCheck(const comm::TrafficCounters& counters, const comm::Layout& layout,
                  const ModelConfig& model, double tokens, int element_bytes);

  bool on() const { return on_; }
  /// The start of a region of the run.
  void begin();
  /// The end of a region that ran each (piece, pass) of `runs` once: what the tensor-parallel
  /// groups counted since begin() must be their description.
  void end(std::initializer_list<std::pair<tp::Piece, tp::Pass>> runs);

private:
  struct Count {
    std::uint64_t calls = 0;
    double bytes = 0;
  };
  using Counts = std::map<std::pair<std::string, comm::Kind>, Count>;
  Counts snapshot() const;

  const comm::TrafficCounters& counters_;
  comm::Layout layout_;
  ModelConfig model_;
  double tokens_;
  int element_bytes_; // the model's element (float, or double in tests)
  bool on_ = false;
  std::map<std::string, int> groups_; // the tensor-parallel groups and their ranks
  Counts before_;
};

} // namespace cubelm::model::detail
