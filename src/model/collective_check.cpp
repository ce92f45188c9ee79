#include "collective_check.hpp"

#include "cubelm/core/error.hpp"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace cubelm::model::detail {

namespace {

const char* piece_name(tp::Piece piece) {
  switch (piece) {
  case tp::Piece::lookup:
    return "lookup";
  case tp::Piece::attention:
    return "attention";
  case tp::Piece::mlp:
    return "mlp";
  case tp::Piece::moe:
    return "moe";
  case tp::Piece::head:
    return "head";
  case tp::Piece::table:
    return "table";
  }
  return "?";
}

} // namespace

CollectiveCheck::CollectiveCheck(const comm::TrafficCounters& counters, const comm::Layout& layout,
                                 const ModelConfig& model, double tokens, int element_bytes)
    : counters_(counters), layout_(layout), model_(model), tokens_(tokens),
      element_bytes_(element_bytes) {
  const char* env = std::getenv("CUBELM_CHECK_COLLECTIVES");
  on_ = env != nullptr && *env != '\0' && std::string(env) != "0";
  for (const auto& [group, ranks] : tp::collective_groups(layout))
    groups_[group] = ranks;
}

CollectiveCheck::Counts CollectiveCheck::snapshot() const {
  Counts out;
  for (const comm::TrafficEntry& e : counters_.entries())
    if (groups_.count(e.group) != 0)
      out[{e.group, e.kind}] = {e.calls, e.bytes};
  return out;
}

void CollectiveCheck::begin() {
  if (on_)
    before_ = snapshot();
}

void CollectiveCheck::end(std::initializer_list<std::pair<tp::Piece, tp::Pass>> runs) {
  if (!on_)
    return;
  Counts issued = snapshot();
  for (const auto& [key, c] : before_) {
    issued[key].calls -= c.calls;
    issued[key].bytes -= c.bytes;
  }
  Counts described;
  std::string what;
  for (const auto& [piece, pass] : runs) {
    what += std::string(what.empty() ? "" : " + ") + piece_name(piece) +
            (pass == tp::Pass::forward ? " forward" : " backward");
    for (const tp::Collective& c : tp::collectives(layout_, model_, tokens_, piece, pass)) {
      Count& d = described[{c.group, c.kind}];
      d.calls += static_cast<std::uint64_t>(std::llround(c.calls));
      d.bytes += comm::modeled_bytes_sent(c.kind, groups_.at(c.group),
                                          c.elements * tp::element_bytes(c, element_bytes_));
    }
  }
  for (const Counts* side : {&issued, &described})
    for (const auto& [key, unused] : *side) {
      (void)unused;
      const Count i = issued.count(key) ? issued.at(key) : Count{};
      const Count d = described.count(key) ? described.at(key) : Count{};
      const bool same = i.calls == d.calls &&
                        std::fabs(i.bytes - d.bytes) <= 1e-9 * std::max(1.0, std::fabs(d.bytes));
      if (!same) {
        std::ostringstream msg;
        msg << what << " on " << key.first << ": " << comm::kind_name(key.second) << " issued "
            << i.calls << " calls, " << i.bytes << " bytes; tp/collectives.hpp describes "
            << d.calls << " calls, " << d.bytes << " bytes";
        CUBELM_ASSERT(same, msg.str());
      }
    }
}

} // namespace cubelm::model::detail
