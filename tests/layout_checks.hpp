#pragma once
// Checks shared by the tests that run a layout against one process or against the closed
// forms (test_pipeline, test_moe_parallel, test_context_parallel, test_planner).

#include "cubelm/cost/memory.hpp"
#include "cubelm/cost/traffic.hpp"
#include "cubelm/train/trainer.hpp"

#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace cubelm::testing {

/// The traffic a step counted (`counted`) against the closed form (`expected`): the calls
/// of every (group, kind) exactly, the bytes within `rel` except for the groups of
/// `calls_only` (whose bytes depend on the data), and nothing counted that the closed
/// form lacks. Returns the closed form's total bytes.
inline double expect_traffic(const std::vector<comm::TrafficEntry>& counted,
                             const std::vector<cost::TrafficVolume>& expected, double rel = 1e-9,
                             const std::vector<std::string>& calls_only = {}) {
  double total = 0;
  for (const auto& e : expected) {
    SCOPED_TRACE(e.group + " " + comm::kind_name(e.kind));
    const auto it = std::find_if(counted.begin(), counted.end(), [&](const auto& x) {
      return x.group == e.group && x.kind == e.kind;
    });
    total += e.bytes;
    EXPECT_NE(it, counted.end());
    if (it == counted.end())
      continue;
    EXPECT_EQ(it->calls, e.calls);
    if (std::find(calls_only.begin(), calls_only.end(), e.group) == calls_only.end())
      EXPECT_NEAR(it->bytes, e.bytes, rel * e.bytes + 1e-9);
  }
  for (const auto& x : counted)
    if (x.calls > 0)
      EXPECT_TRUE(
          std::any_of(expected.begin(), expected.end(),
                      [&](const auto& e) { return e.group == x.group && e.kind == x.kind; }))
          << "counted but not in the closed form: " << x.group << " " << comm::kind_name(x.kind);
  return total;
}

/// `group` (this job's layout) and `reference` (one process) train alike for `steps`
/// steps: the loss, the load-balancing loss and the gradient norm within `rel`.
inline void expect_same_training(const Deck& group, const Deck& reference, int steps,
                                 double rel = 1e-4) {
  train::Trainer many(group);
  train::Trainer one(reference, self());
  for (int s = 0; s < steps; ++s) {
    const auto a = many.step(), b = one.step();
    EXPECT_NEAR(a.loss, b.loss, rel * b.loss) << "step " << s;
    EXPECT_NEAR(a.aux_loss, b.aux_loss, rel * b.aux_loss) << "step " << s;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, rel * b.grad_norm) << "step " << s;
  }
}

/// After one step of each, every gradient element `group` holds (reduced over its
/// replicas) equals `reference`'s element at the same global index within `tol` (1e-5
/// unless given) of the reference's largest (rows past the reference's padded
/// vocabulary: 0). Returns the number of expert tensors `group` holds.
inline int expect_same_gradients(const Deck& group, const Deck& reference, double tol = 1e-5) {
  train::Trainer many(group);
  train::Trainer one(reference, self());
  many.step();
  one.step();
  std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<double>>> whole;
  double largest = 0;
  for (const auto* q : one.params()) {
    const auto& p = *q;
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.grad);
    whole[p.name] = {p.shape, std::vector<double>(h.data(), h.data() + h.extent(0))};
    for (std::size_t i = 0; i < h.extent(0); ++i)
      largest = std::max(largest, std::fabs(static_cast<double>(h(i))));
  }
  int experts = 0;
  for (const auto* q : many.params()) {
    const auto& p = *q;
    SCOPED_TRACE(p.name);
    experts += p.expert ? 1 : 0;
    EXPECT_EQ(whole.count(p.name), 1u);
    if (whole.count(p.name) == 0)
      continue;
    const auto& [shape, ref] = whole[p.name];
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.grad);
    const bool matrix = p.local.size() == 2;
    const std::int64_t cols = matrix ? p.local[1] : 1, ref_cols = matrix ? shape[1] : 1;
    double worst = 0;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(h.extent(0)); ++i) {
      const std::int64_t row = p.offset[0] + i / cols, col = matrix ? p.offset[1] + i % cols : 0;
      const double want =
          row < shape[0] ? ref[static_cast<std::size_t>(row * ref_cols + col)] : 0.0;
      worst = std::max(worst, std::fabs(static_cast<double>(h(i)) - want));
    }
    EXPECT_LE(worst, tol * largest);
  }
  return experts;
}

/// `deck` with another train.precision (bf16: the model stores bfloat16).
inline Deck with_precision(Deck deck, Precision precision) {
  deck.train.precision = precision;
  return deck;
}

/// The parameters, gradients and activations trainer `t` of deck `d` allocates equal the
/// estimate of its rank's stage; returns the estimate.
inline cost::Memory expect_model_memory_as_estimated(const train::Trainer& t, const Deck& d) {
  const cost::Memory measured = t.memory();
  const cost::Memory estimate = cost::estimate_memory(d, t.grid().coords().pp);
  EXPECT_EQ(measured.parameters, estimate.parameters);
  EXPECT_EQ(measured.gradients, estimate.gradients);
  EXPECT_EQ(measured.activations, estimate.activations);
  return estimate;
}

/// What a trainer of `deck` allocates equals the estimate of its rank's stage, every kind;
/// and the same under bf16 (2-byte activations and weight copies).
inline void expect_memory_as_estimated(const Deck& deck) {
  for (const Precision precision : {deck.train.precision, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    const Deck d = with_precision(deck, precision);
    train::Trainer t(d);
    const cost::Memory estimate = expect_model_memory_as_estimated(t, d);
    EXPECT_EQ(t.memory().optimizer, estimate.optimizer);
  }
}

/// `group` trains `saved_at` steps and saves; rank 0 resumes the checkpoint on one process
/// under `reference` and its next `more` losses equal the group's within 1e-4.
inline void expect_resumes_on_one_process(const Deck& group, const Deck& reference,
                                          const char* stem, int saved_at, int more) {
  const comm::Communicator world = comm::Communicator::world();
  const std::string path = temp_path(stem);
  train::Trainer many(group);
  for (int s = 0; s < saved_at; ++s)
    many.step();
  many.save(path);
  std::vector<double> losses;
  for (int s = 0; s < more; ++s)
    losses.push_back(many.step().loss);
  if (world.rank() == 0) {
    train::Trainer one(reference, self());
    one.resume(path);
    EXPECT_EQ(one.steps_done(), saved_at);
    for (int s = 0; s < more; ++s)
      EXPECT_NEAR(one.step().loss, losses[s], 1e-4 * losses[s]) << "step " << saved_at + s;
  }
  MPI_Barrier(world.raw());
  if (world.rank() == 0)
    std::filesystem::remove(path);
}

} // namespace cubelm::testing
