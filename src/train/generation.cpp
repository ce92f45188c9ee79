#include "cubelm/train/generation.hpp"

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/train/checkpointing.hpp"

#include <algorithm>

namespace cubelm::train {

namespace {

// The deck as generation runs it: fp32, MoE layers dropless. Its layout must fit the ranks,
// and its model be the checkpoint's (every model key that changes what the weights compute).
Deck generation_deck(const Deck& deck, const std::string& checkpoint,
                     const comm::Communicator& comm) {
  comm::layout_of(deck.parallel).validate_for_world(comm.size());
  std::vector<IdentityDifference> model;
  for (const IdentityDifference& d : run_differences(checkpoint, deck, comm))
    if (d.key.rfind("model.", 0) == 0 && d.key != "model.capacity_factor" &&
        d.key != "model.aux_loss")
      model.push_back(d);
  if (!model.empty())
    throw Error("--deck " + deck.source + ": its model is not the checkpoint's (" +
                    describe_differences(model) + "; checkpoint " + checkpoint +
                    "): give the deck of the run that wrote it, with the layout to generate in",
                true);
  Deck d = deck;
  d.train.precision = Precision::fp32;
  d.model.capacity_factor = 0;
  return d;
}

} // namespace

LayoutGenerator::LayoutGenerator(const Deck& deck, const std::string& checkpoint,
                                 const comm::Communicator& comm)
    : deck_(generation_deck(deck, checkpoint, comm)), watchdog_(deck.parallel.timeout_s),
      plan_(pipeline::make_plan(deck_.parallel, deck_.model)),
      stage_(plan_, comm::stage_of(deck_.parallel, comm.rank())), batch_(deck_.micro_batch()) {
  net_ = std::make_unique<model::GridModel<real>>(
      deck_.model, batch_, static_cast<std::uint64_t>(deck_.train.seed),
      comm::layout_of(deck_.parallel), comm, stage_.layout(false));
  load_weights(checkpoint, *net_->model, comm);
  out_ = kernels::Vec<float>("cubelm::generation/logits", deck_.model.vocab_size);
  logits_.resize(static_cast<std::size_t>(deck_.model.vocab_size));
}

LayoutGenerator::~LayoutGenerator() = default;

const std::vector<float>& LayoutGenerator::feed(const std::vector<std::int32_t>& tokens) {
  CUBELM_ASSERT(!tokens.empty(), "LayoutGenerator::feed needs at least one token");
  const ModelConfig& c = deck_.model;
  const int p = position(), n = static_cast<int>(tokens.size());
  if (static_cast<std::int64_t>(p) + n > c.seq_len)
    throw Error(
        "positions " + std::to_string(p) + " to " + std::to_string(p + n - 1) +
            " do not fit the model's context: model.seq_len = " + std::to_string(c.seq_len) +
            " positions (0 to " + std::to_string(c.seq_len - 1) + ")",
        true);
  for (int i = 0; i < n; ++i) {
    const std::int32_t t = tokens[static_cast<std::size_t>(i)];
    if (t < 0 || t >= c.vocab_size)
      throw Error("token " + std::to_string(i) + " is " + std::to_string(t) +
                      ", outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")",
                  true);
  }
  context_.insert(context_.end(), tokens.begin(), tokens.end());
  // Every sequence of the micro-batch is the context, then token 0 up to model.seq_len:
  // causal attention keeps the positions after the context out of its logits.
  const std::size_t T = static_cast<std::size_t>(c.seq_len);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(batch_) * T, 0);
  for (int s = 0; s < batch_; ++s)
    std::copy(context_.begin(), context_.end(),
              inputs.begin() + static_cast<std::ptrdiff_t>(s * T));
  std::vector<std::int32_t> marks(inputs.size(), 0);
  marks[context_.size() - 1] = 1; // the last token of the first sequence
  const ExecSpace exec;
  stage_.logits(exec, *net_->model, *net_->grid, inputs, marks, out_);
  // Replicas compute the same logits; the first one's make every rank sample alike.
  if (net_->grid->dp().size() > 1)
    net_->grid->dp().broadcast(exec, out_, 0);
  exec.fence();
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out_);
  std::copy(host.data(), host.data() + host.extent(0), logits_.begin());
  return logits_;
}

} // namespace cubelm::train
