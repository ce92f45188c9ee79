// A training step in steady state allocates no Kokkos memory: every buffer it needs
// (activations, workspaces, token indexes, communication staging, optimizer state) is
// allocated by the first step at the latest. Counted with Kokkos Tools' allocation
// callback over steps 2-4 of every tensor mode, pipeline schedule, data parallelism
// with and without ZeRO-1, and recompute, at the job's world size.
//
// One exception, counted exactly: a pipeline stage whose input-gradient send is still
// in flight when the slot is reused takes another input buffer from a pool
// (PipelineStage::pooled_inputs). The pool only grows when more sends are in flight at
// once than ever before, which depends on timing; each such growth is one allocation,
// and the pool never holds more buffers than the step sends input gradients.
//
// test_allocations_staged runs the same with CUBELM_STAGE_HOST_MEMORY=1: every
// collective and transfer through host copies in its group's staging buffers, the
// route of device memory where ranks share a GPU. Those buffers are reused; for the
// same reason as above, the pp group's pool takes one more buffer when more of the
// pipeline's transfers are in flight at once than ever before, counted exactly, and
// it never holds more than a step's transfers. No other group's pool grows.

#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "layouts.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <map>
#include <string>
#include <vector>

using namespace cubelm;
using cubelm::testing::DeckText;
using cubelm::testing::layouts;
using cubelm::testing::world_size;

namespace {

bool g_counting = false;
std::map<std::string, int> g_allocations; // by View label

void on_allocate(Kokkos::Profiling::SpaceHandle, const char* label, const void*, std::uint64_t) {
  if (g_counting)
    ++g_allocations[label];
}

Deck deck_for(const std::string& parallel, const std::string& model = "") {
  return DeckText()
      .set("model.layers", 4)
      .lines("model", model)
      .lines("parallel", parallel)
      .deck("allocations.toml");
}

void expect_no_allocations(const std::vector<std::string>& all, const std::string& model) {
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  ASSERT_FALSE(all.empty()) << "no layouts for " << world_size() << " ranks";
  for (const std::string& layout : all) {
    SCOPED_TRACE(layout);
    const Deck deck = deck_for(layout, model);
    train::Trainer trainer(deck);
    trainer.step(); // the first step may allocate what it keeps
    const int pooled = trainer.stage().pooled_inputs();
    const comm::detail::StagingPool& pp_staging = trainer.grid().pp().staging();
    const auto pp_buffers = static_cast<int>(pp_staging.buffers());
    g_allocations.clear();
    g_counting = true;
    for (int s = 0; s < 3; ++s)
      trainer.step();
    g_counting = false;
    const int grown = trainer.stage().pooled_inputs() - pooled;
    if (grown > 0 && g_allocations["cubelm::stream"] == grown)
      g_allocations.erase("cubelm::stream");
    const int staged = static_cast<int>(pp_staging.buffers()) - pp_buffers;
    if (staged > 0 && g_allocations["cubelm::comm::stage"] == staged)
      g_allocations.erase("cubelm::comm::stage");
    std::string found;
    for (const auto& [label, n] : g_allocations)
      found += " " + label + " x" + std::to_string(n);
    EXPECT_TRUE(g_allocations.empty()) << "allocations in steps 2-4:" << found;
    const int sends = deck.parallel.microbatches * deck.parallel.virtual_stages;
    EXPECT_LE(trainer.stage().pooled_inputs(), sends);
    // pp's staging buffers: at most the transfers of a step (sends and receives, both ways).
    EXPECT_LE(static_cast<int>(pp_staging.buffers()), 4 * sends);
  }
  Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
}

} // namespace

TEST(Allocations, SteadyStateStepsAllocateNothing) {
  expect_no_allocations(layouts("allocations"), "");
}

// MoE layers too: the expert rows' buffers are sized for the worst case at construction.
TEST(Allocations, MoEStepsAllocateNothing) {
  // Expert parallelism, ZeRO-1, pipelines, 2d tensor parallelism.
  expect_no_allocations(layouts("allocations_moe"), "experts = 4\ntop_k = 2\nmoe_every = 2\n");
}

// Context parallelism: the gathered keys and values, the blocks and the local token ids
// are kept between steps.
TEST(Allocations, ContextParallelStepsAllocateNothing) {
  if (world_size() == 1)
    GTEST_SKIP() << "context parallelism needs 2 ranks or more";
  // An empty dense list fails (expect_no_allocations).
  const std::vector<std::string> dense = layouts("context"), moe = layouts("context_moe");
  expect_no_allocations(dense, "");
  if (!moe.empty())
    expect_no_allocations(moe, "experts = 4\ntop_k = 2\nmoe_every = 2\n");
}
