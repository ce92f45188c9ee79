// The layout's rules of a deck: each one belongs to the layer that defines it (the
// pipeline's plan, the process grid, the tensor modes' shapes, the experts' placement), and
// is checked here, above all of them, with the lines the deck reader kept.

#include "cubelm/cost/deck.hpp"

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/pipeline/schedule.hpp"
#include "cubelm/tp/shapes.hpp"

#include <string>
#include <utility>

namespace cubelm::cost {

namespace {

/// The keys of one [section], for messages.
class Keys {
public:
  Keys(const io::DeckKeys& keys, const char* section) : keys_(keys), section_(section) {}

  [[noreturn]] void fail(const std::string& key, const std::string& rule,
                         const std::string& fallback = "") const {
    keys_.fail(section_ + "." + key, rule, fallback);
  }
  void require(bool ok, const std::string& key, const std::string& rule) const {
    if (!ok)
      fail(key, rule);
  }

private:
  const io::DeckKeys& keys_;
  std::string section_;
};

} // namespace

void check_layout(const io::ReadDeck& read) {
  const Deck& deck = read.deck;
  const ModelConfig& m = deck.model;
  const ParallelConfig& p = deck.parallel;
  const Keys par(read.keys, "parallel"), train(read.keys, "train");
  {
    // The schedule's rules (pipeline/schedule.hpp: a layer per stage, one virtual stage
    // unless interleaved, the interleaved divisibility).
    const pipeline::PlanProblem bad = pipeline::check_plan(
        p.schedule, p.pipeline_size, p.microbatches, p.virtual_stages, m.layers);
    if (bad.key.rfind("parallel.", 0) == 0)
      par.fail(bad.key.substr(9), bad.rule, bad.value);
    else if (!bad.key.empty()) // model.layers: reported with the pipeline it does not fit
      par.fail("pipeline_size", bad.message(), std::to_string(p.pipeline_size));
  }
  {
    // 2 cp chunks per sequence, of equal length (the causal load balance).
    const int chunks = 2 * p.context_size;
    std::string valid = "1";
    for (int c = 2; 2 * c <= m.seq_len; ++c)
      if (m.seq_len % (2 * c) == 0)
        valid += ", " + std::to_string(c);
    par.require(p.context_size == 1 || m.seq_len % chunks == 0, "context_size",
                "must split model.seq_len = " + std::to_string(m.seq_len) +
                    " into 2 x context_size equal chunks (2 x " + std::to_string(p.context_size) +
                    " = " + std::to_string(chunks) + " must divide it); valid: " + valid);
  }
  try {
    comm::Layout sizes = comm::layout_of(p);
    sizes.ep = sizes.etp = 1; // the experts' rules are checked below, under their own keys
    sizes.validate();
  } catch (const Error& e) {
    par.fail("tensor_size", e.what());
  }
  {
    const int tp = p.tensor_size, etp = p.expert_tensor_size;
    if (etp != 1 && etp != tp)
      par.fail("expert_tensor_size",
               "must be 1 (whole experts) or tensor_size = " + std::to_string(tp) +
                   " (each expert's hidden layer split over the tensor ranks)",
               std::to_string(etp));
    else if (etp > 1 && m.experts <= 1)
      par.fail("expert_tensor_size",
               "splits the experts of MoE layers: it needs model.experts > 1 (model.experts = " +
                   std::to_string(m.experts) + "); use expert_tensor_size = 1",
               std::to_string(etp));
    else if (etp > 1 && (4LL * m.hidden) % tp != 0)
      par.fail("expert_tensor_size",
               "splits each expert's 4 x model.hidden = " + std::to_string(4LL * m.hidden) +
                   " hidden features over tensor_size = " + std::to_string(tp) +
                   ", which must divide them",
               std::to_string(etp));
  }
  {
    // The experts spread over tensor_size x r ranks, r a divisor of the replicas (with
    // expert tensor parallelism over r ranks of one tensor rank), and each rank holds as
    // many of them.
    const int replicas = p.data_size * p.context_size;
    const bool split = p.expert_tensor_size > 1 && p.expert_tensor_size == p.tensor_size;
    const int tp = split ? 1 : p.tensor_size;
    std::string valid = tp == 1 ? "1" : "";
    for (int r = 1; r <= replicas; ++r)
      if (replicas % r == 0 && m.experts % (tp * r) == 0 && tp * r > 1)
        valid += (valid.empty() ? "" : ", ") + std::to_string(tp * r);
    if (valid.empty())
      valid = "none (model.experts must be a multiple of tensor_size)";
    const std::string replicas_text = "data_size x context_size = " + std::to_string(p.data_size) +
                                      " x " + std::to_string(p.context_size) + " = " +
                                      std::to_string(replicas);
    const int e = p.expert_size;
    if (e > 1 && m.experts <= 1)
      par.fail("expert_size",
               "expert parallelism spreads the experts of MoE layers: it needs model.experts > 1 "
               "(model.experts = " +
                   std::to_string(m.experts) + "); use expert_size = 1",
               std::to_string(e));
    else if (e > 1 && tp == 1 && (replicas % e != 0 || m.experts % e != 0))
      par.fail("expert_size",
               "must divide both " + replicas_text +
                   " (the expert-parallel groups are carved out of the replicas of the "
                   "parameters" +
                   (split ? std::string(", each tensor rank's apart: expert_tensor_size = "
                                        "tensor_size")
                          : std::string()) +
                   ") and model.experts = " + std::to_string(m.experts) +
                   " (each rank holds as many experts); valid: " + valid,
               std::to_string(e));
    else if (m.experts > 1 && tp > 1 &&
             (e % tp != 0 || replicas % (e / tp) != 0 || m.experts % e != 0))
      par.fail(
          "expert_size",
          "must be tensor_size = " + std::to_string(tp) + " times a divisor of " + replicas_text +
              " (the MoE layers fold the tensor-parallel ranks and replicas of the "
              "parameters into expert parallelism) and divide model.experts = " +
              std::to_string(m.experts) + " (each rank holds as many experts); valid: " + valid,
          std::to_string(e));
  }

  const int per_step = p.data_size * p.microbatches;
  const std::string broken = tp::check_shapes(comm::layout_of(p), m, deck.micro_batch());
  if (!broken.empty()) {
    // When another global batch fits this layout, the batch is what to change.
    std::string batches;
    int listed = 0;
    for (int g = per_step; g <= 64 * per_step && listed < 4; g += per_step)
      if (tp::check_shapes(comm::layout_of(p), m, g / per_step).empty()) {
        batches += (batches.empty() ? "" : ", ") + std::to_string(g);
        ++listed;
      }
    if (!batches.empty())
      train.fail("global_batch",
                 std::string("tensor_mode = \"") + mode_name(p.tensor_mode) +
                     "\" with tensor_size = " + std::to_string(p.tensor_size) + " needs " + broken +
                     "; global batches that fit this layout: " + batches + ", ...",
                 std::to_string(deck.train.global_batch));
    std::string fits;
    for (int t = 2; t <= 512; ++t) {
      comm::Layout l = comm::layout_of(p);
      l.tp = t;
      try {
        l.validate();
      } catch (const Error&) {
        continue;
      }
      if (tp::check_shapes(l, m, deck.micro_batch()).empty())
        fits += (fits.empty() ? "" : ", ") + std::to_string(t);
    }
    par.fail("tensor_size", std::string("tensor_mode = \"") + mode_name(p.tensor_mode) +
                                "\" needs " + broken +
                                (fits.empty() ? "; no tensor_size fits this model"
                                              : "; tensor sizes that fit this model: " + fits));
  }
}

Deck parse_deck(const std::string& text, const std::string& source) {
  io::ReadDeck read = io::read_deck(text, source);
  check_layout(read);
  return std::move(read.deck);
}

Deck load_deck(const std::string& path) {
  io::ReadDeck read = io::read_deck_file(path);
  check_layout(read);
  return std::move(read.deck);
}

} // namespace cubelm::cost
