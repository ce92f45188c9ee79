#pragma once
// The layouts the whole-model tests run, in one table: each case says the ranks it needs,
// its deck's [parallel] lines and which tests run it. A test asks for its cases at the
// job's world size (layouts("allocations")) instead of keeping a switch of its own, so
// that a new layout or a new rank count is one line here. An empty answer is for the test
// to refuse (ADD_FAILURE), not to pass without a case.

#include "deck_text.hpp"
#include "test_helpers.hpp"

#include <algorithm>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

namespace cubelm::testing {

struct LayoutCase {
  int world;                 // the ranks it needs
  std::string parallel;      // the deck's [parallel] lines
  std::set<std::string> use; // the tests that run it
  std::string model = "";    // [model] lines over the test's own model
  int sequences = 0;         // sequences per micro-batch (0: the test's own)
};

inline const std::vector<LayoutCase>& layout_table() {
  static const std::vector<LayoutCase> table = {
      // One rank.
      {1, "", {"allocations", "precision", "padding"}},
      {1, "microbatches = 2\nrecompute = \"full\"", {"allocations"}},
      {1, "microbatches = 2", {"allocations_moe"}},
      // Two ranks.
      {2, "tensor_mode = \"1d\"\ntensor_size = 2", {"allocations", "precision", "padding"}},
      {2, "tensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = true", {"allocations"}},
      {2, "data_size = 2", {"allocations"}},
      {2, "data_size = 2\nzero = 1\nmicrobatches = 2", {"allocations"}},
      {2, "pipeline_size = 2\nschedule = \"gpipe\"\nmicrobatches = 4", {"allocations"}},
      {2,
       "pipeline_size = 2\nschedule = \"1f1b\"\nmicrobatches = 4\nrecompute = \"full\"",
       {"allocations"}},
      {2,
       "pipeline_size = 2\nschedule = \"interleaved\"\nvirtual_stages = 2\nmicrobatches = 4",
       {"allocations"}},
      {2, "pipeline_size = 2\nschedule = \"layered\"\nmicrobatches = 4", {"allocations"}},
      {2, "data_size = 2\nexpert_size = 2", {"allocations_moe"}},
      {2, "data_size = 2\nexpert_size = 2\nzero = 1", {"allocations_moe"}},
      {2, "context_size = 2", {"context"}},
      {2, "context_size = 2\nrecompute = \"full\"", {"context"}},
      // Four ranks.
      {4, "tensor_mode = \"1d\"\ntensor_size = 4", {"padding"}},
      {4, "tensor_mode = \"2d\"\ntensor_size = 4", {"allocations", "precision", "padding"}},
      {4,
       "tensor_mode = \"1d\"\ntensor_size = 2\npipeline_size = 2\nmicrobatches = 2",
       {"allocations"}},
      {4,
       "tensor_mode = \"1d\"\ntensor_size = 2\npipeline_size = 2\nmicrobatches = 2\n"
       "sequence_parallel = true\nrecompute = \"full\"",
       {"allocations"}},
      {4, "tensor_mode = \"1d\"\ntensor_size = 2\ndata_size = 2\nzero = 1", {"allocations"}},
      {4, "data_size = 4\nexpert_size = 4\nrecompute = \"full\"", {"allocations_moe"}},
      {4,
       "pipeline_size = 2\ndata_size = 2\nexpert_size = 2\nmicrobatches = 2\nzero = 1",
       {"allocations_moe"}},
      {4, "tensor_mode = \"2d\"\ntensor_size = 4\nexpert_size = 4", {"allocations_moe"}},
      {4, "context_size = 2\ndata_size = 2\nzero = 1", {"context"}},
      {4, "context_size = 2\ntensor_mode = \"1d\"\ntensor_size = 2", {"context"}},
      {4, "context_size = 2\ndata_size = 2\nexpert_size = 4", {"context_moe"}},
      // Eight ranks.
      {8, "tensor_mode = \"1d\"\ntensor_size = 8", {"padding"}},
      {8, "tensor_mode = \"3d\"\ntensor_size = 8", {"allocations", "precision", "padding"}},
      {8,
       "tensor_mode = \"2d\"\ntensor_size = 4\npipeline_size = 2\nschedule = "
       "\"interleaved\"\nvirtual_stages = 2\nmicrobatches = 2",
       {"allocations"}},
      {8,
       "tensor_mode = \"1d\"\ntensor_size = 2\ndata_size = 2\nzero = 1\npipeline_size = 2\n"
       "microbatches = 2",
       {"allocations"}},
      {8,
       "pipeline_size = 2\ndata_size = 4\nexpert_size = 2\nmicrobatches = 2\nzero = 1",
       {"allocations_moe"}},
      {8,
       "tensor_mode = \"2d\"\ntensor_size = 4\ndata_size = 2\nexpert_size = 4\n"
       "recompute = \"full\"",
       {"allocations_moe"}},
      {8,
       "context_size = 2\npipeline_size = 2\ndata_size = 2\nmicrobatches = 2\nzero = 1",
       {"context"}},
      // test_pipeline, 2 ranks (the first saves the checkpoint one process resumes).
      {2, "pipeline_size = 2\nschedule = \"gpipe\"\nmicrobatches = 4", {"pipeline"}},
      {2, "pipeline_size = 2\nmicrobatches = 4", {"pipeline"}},
      {2,
       "pipeline_size = 2\nschedule = \"interleaved\"\nvirtual_stages = 2\nmicrobatches = 4",
       {"pipeline"}},
      {2, "pipeline_size = 2\nschedule = \"layered\"\nmicrobatches = 4", {"pipeline"}},
      {2, "pipeline_size = 2\nmicrobatches = 4\nrecompute = \"full\"", {"pipeline"}},
      {2, "data_size = 2\nmicrobatches = 2", {"pipeline"}},
      {2, "data_size = 2\nmicrobatches = 2\nzero = 1", {"pipeline"}},
      {2,
       "data_size = 2\nschedule = \"layered\"\nmicrobatches = 3\nzero = 1\nrecompute = \"full\"",
       {"pipeline"}},
      // test_pipeline, 4 ranks (the first saves the checkpoint one process resumes).
      {4,
       "tensor_mode = \"1d\"\ntensor_size = 2\npipeline_size = 2\nmicrobatches = 4",
       {"pipeline"}},
      {4,
       "tensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = true\npipeline_size = "
       "2\nschedule = \"interleaved\"\nvirtual_stages = 2\nmicrobatches = 4\nrecompute = \"full\"",
       {"pipeline"}},
      {4,
       "tensor_mode = \"1d\"\ntensor_size = 4\nsequence_parallel = true\nmicrobatches = "
       "2\nrecompute = \"full\"",
       {"pipeline"}},
      {4,
       "pipeline_size = 2\ndata_size = 2\nschedule = \"interleaved\"\nvirtual_stages = "
       "2\nmicrobatches = 2\nzero = 1",
       {"pipeline"}},
      {4, "pipeline_size = 4\nschedule = \"gpipe\"\nmicrobatches = 4", {"pipeline"}},
      {4,
       "pipeline_size = 4\nschedule = \"layered\"\nmicrobatches = 5\nrecompute = \"full\"",
       {"pipeline"}},
      {4,
       "tensor_mode = \"2d\"\ntensor_size = 4\nschedule = \"layered\"\nmicrobatches = 2",
       {"pipeline"}},
      {4, "data_size = 4\nzero = 1", {"pipeline"}},
      // test_pipeline, 8 ranks (the first saves the checkpoint one process resumes).
      {8,
       "tensor_mode = \"1d\"\ntensor_size = 2\npipeline_size = 2\ndata_size = 2\nmicrobatches = "
       "2\nzero = 1",
       {"pipeline"}},
      {8,
       "tensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = true\npipeline_size = "
       "2\ndata_size = 2\nschedule = \"layered\"\nmicrobatches = 2\nzero = 1",
       {"pipeline"}},
      {8,
       "tensor_mode = \"2d\"\ntensor_size = 4\npipeline_size = 2\nmicrobatches = 2",
       {"pipeline"}},
      {8,
       "tensor_mode = \"3d\"\ntensor_size = 8\nschedule = \"layered\"\nmicrobatches = 2\nrecompute "
       "= \"full\"",
       {"pipeline"}},
      {8, "pipeline_size = 4\ndata_size = 2\nmicrobatches = 4", {"pipeline"}},
      {8, "data_size = 8\nschedule = \"layered\"\nmicrobatches = 2\nzero = 1", {"pipeline"}},
      // test_moe_parallel, 2 ranks.
      {2, "data_size = 2\nexpert_size = 2", {"moe_parallel"}},
      {2,
       "data_size = 2\nexpert_size = 2\nmicrobatches = 2\nzero = 1\nrecompute = \"full\"",
       {"moe_parallel"}},
      {2, "data_size = 2\nexpert_size = 2", {"moe_parallel"}, "capacity_factor = 1.0"},
      {2, "data_size = 2\nmicrobatches = 2\nzero = 1", {"moe_parallel"}},
      {2, "pipeline_size = 2\nmicrobatches = 4", {"moe_parallel"}},
      {2, "tensor_mode = \"1d\"\ntensor_size = 2\nexpert_size = 2", {"moe_parallel"}},
      {2,
       "tensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = true\nexpert_size = "
       "2\nmicrobatches = 2\nrecompute = \"full\"",
       {"moe_parallel"}},
      {2, "tensor_mode = \"1d\"\ntensor_size = 2\nexpert_tensor_size = 2", {"moe_parallel"}},
      {2,
       "tensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = true\nexpert_tensor_size = "
       "2\nmicrobatches = 2\nrecompute = \"full\"",
       {"moe_parallel"}},
      // test_moe_parallel, 4 ranks.
      {4, "data_size = 4\nexpert_size = 4", {"moe_parallel"}},
      {4,
       "data_size = 4\nexpert_size = 2\nmicrobatches = 2\nzero = 1\nrecompute = \"full\"",
       {"moe_parallel"}},
      {4, "pipeline_size = 2\ndata_size = 2\nexpert_size = 2\nmicrobatches = 2", {"moe_parallel"}},
      {4,
       "pipeline_size = 2\ndata_size = 2\nexpert_size = 2\nschedule = "
       "\"interleaved\"\nvirtual_stages = 2\nmicrobatches = 2\nzero = 1",
       {"moe_parallel"},
       "capacity_factor = 1.25"},
      {4,
       "tensor_mode = \"1d\"\ntensor_size = 2\ndata_size = 2\nexpert_size = 4\nmicrobatches = 2",
       {"moe_parallel"}},
      {4,
       "tensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = true\ndata_size = "
       "2\nexpert_size = 2\nzero = 1",
       {"moe_parallel"}},
      {4,
       "tensor_mode = \"2d\"\ntensor_size = 4\nexpert_size = 4\nmicrobatches = 2",
       {"moe_parallel"}},
      {4,
       "tensor_mode = \"2d\"\ntensor_size = 4\nexpert_size = 4\nrecompute = \"full\"",
       {"moe_parallel"},
       "",
       4},
      {4,
       "tensor_mode = \"1d\"\ntensor_size = 2\ndata_size = 2\nexpert_size = 2\nexpert_tensor_size "
       "= 2\nmicrobatches = 2\nzero = 1",
       {"moe_parallel"}},
      {4,
       "tensor_mode = \"2d\"\ntensor_size = 4\nexpert_tensor_size = 4\nmicrobatches = 2",
       {"moe_parallel"}},
      // test_moe_parallel, 8 ranks.
      {8, "data_size = 8\nexpert_size = 4\nzero = 1", {"moe_parallel"}},
      {8,
       "pipeline_size = 2\ndata_size = 4\nexpert_size = 4\nschedule = \"layered\"\nmicrobatches = "
       "2\nzero = 1\nrecompute = \"full\"",
       {"moe_parallel"}},
      {8,
       "pipeline_size = 2\ndata_size = 4\nexpert_size = 2\nschedule = \"gpipe\"\nmicrobatches = 2",
       {"moe_parallel"}},
      {8,
       "pipeline_size = 4\ndata_size = 2\nexpert_size = 2\nmicrobatches = 4",
       {"moe_parallel"},
       "capacity_factor = 1.0"},
      {8,
       "tensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = true\npipeline_size = "
       "2\ndata_size = 2\nexpert_size = 4\nmicrobatches = 2\nrecompute = \"full\"",
       {"moe_parallel"}},
      {8,
       "tensor_mode = \"2d\"\ntensor_size = 4\ndata_size = 2\nexpert_size = 4\nmicrobatches = "
       "2\nzero = 1",
       {"moe_parallel"}},
      {8,
       "tensor_mode = \"2d\"\ntensor_size = 4\npipeline_size = 2\nexpert_size = 4\nmicrobatches = "
       "2\nrecompute = \"full\"",
       {"moe_parallel"},
       "capacity_factor = 2.0"},
      {8,
       "tensor_mode = \"3d\"\ntensor_size = 8\nexpert_size = 8\nmicrobatches = 2",
       {"moe_parallel"},
       "experts = 8",
       4},
      {8,
       "tensor_mode = \"3d\"\ntensor_size = 8\nexpert_size = 8\nrecompute = \"full\"",
       {"moe_parallel"},
       "experts = 8",
       4},
      {8, "tensor_mode = \"3d\"\ntensor_size = 8\nexpert_tensor_size = 8", {"moe_parallel"}, "", 4},
      {8,
       "tensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = true\npipeline_size = "
       "2\ndata_size = 2\nexpert_size = 2\nexpert_tensor_size = 2\nmicrobatches = 2",
       {"moe_parallel"}},
      // test_context_parallel, 2 ranks.
      {2, "context_size = 2", {"context_parallel"}},
      {2,
       "context_size = 2\nmicrobatches = 2\nzero = 1\nrecompute = \"full\"",
       {"context_parallel"}},
      {2,
       "context_size = 2\nexpert_size = 2",
       {"context_parallel"},
       "experts = 4\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01"},
      {2,
       "context_size = 2\nmicrobatches = 2\nzero = 1\nrecompute = \"full\"",
       {"context_parallel"},
       "experts = 4\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01"},
      // test_context_parallel, 4 ranks.
      {4, "context_size = 4", {"context_parallel"}},
      {4, "context_size = 2\ndata_size = 2\nzero = 1", {"context_parallel"}},
      {4, "context_size = 2\ntensor_mode = \"1d\"\ntensor_size = 2", {"context_parallel"}},
      {4,
       "context_size = 2\npipeline_size = 2\nschedule = \"interleaved\"\nvirtual_stages = "
       "2\nmicrobatches = 2\nrecompute = \"full\"",
       {"context_parallel"}},
      {4,
       "context_size = 2\ndata_size = 2\nexpert_size = 4\nzero = 1",
       {"context_parallel"},
       "experts = 4\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01"},
      {4,
       "context_size = 2\ntensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = "
       "true\nexpert_size = 2",
       {"context_parallel"},
       "experts = 4\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01"},
      // test_context_parallel, 8 ranks.
      {8, "context_size = 2\ntensor_mode = \"2d\"\ntensor_size = 4", {"context_parallel"}},
      {8,
       "context_size = 2\ntensor_mode = \"1d\"\ntensor_size = 2\nsequence_parallel = "
       "true\ndata_size = 2",
       {"context_parallel"}},
      {8,
       "context_size = 2\ndata_size = 2\npipeline_size = 2\nschedule = \"gpipe\"\nmicrobatches = "
       "2\nzero = 1\nrecompute = \"full\"",
       {"context_parallel"}},
      {8,
       "context_size = 2\ndata_size = 2\npipeline_size = 2\nexpert_size = 4\nmicrobatches = "
       "2\nzero = 1",
       {"context_parallel"},
       "experts = 4\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01"},
      {8, "context_size = 8", {"context_parallel"}},
      {8,
       "context_size = 2\ntensor_mode = \"1d\"\ntensor_size = 2\ndata_size = 2\nexpert_size = "
       "4\nmicrobatches = 2\nrecompute = \"full\"",
       {"context_parallel"},
       "experts = 4\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01"},
      {8,
       "context_size = 2\ntensor_mode = \"2d\"\ntensor_size = 4\nexpert_size = 4\nmicrobatches = 2",
       {"context_parallel"},
       "experts = 4\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01"},
      // test_context_parallel, 16 ranks.
      {16, "context_size = 2\ntensor_mode = \"3d\"\ntensor_size = 8", {"context_parallel"}, "", 4},
      {16,
       "context_size = 2\ntensor_mode = \"3d\"\ntensor_size = 8\nexpert_size = 8\nrecompute = "
       "\"full\"",
       {"context_parallel"},
       "experts = 8\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01",
       4},
      {16,
       "context_size = 2\ntensor_mode = \"1d\"\ntensor_size = 2\ndata_size = 4\nexpert_size = 4",
       {"context_parallel"},
       "experts = 4\ntop_k = 2\nmoe_every = 2\naux_loss = 0.01"},
  };
  return table;
}

/// The cases that `use` runs at this job's world size, in the table's order.
inline std::vector<LayoutCase> layout_cases(const std::string& use) {
  std::vector<LayoutCase> out;
  for (const LayoutCase& c : layout_table())
    if (c.world == world_size() && c.use.count(use) != 0)
      out.push_back(c);
  return out;
}

/// The cases of several uses at this job's world size: each use's in the table's order,
/// one use after the other.
inline std::vector<LayoutCase> layout_cases(std::initializer_list<const char*> uses) {
  std::vector<LayoutCase> out;
  for (const char* use : uses)
    for (const LayoutCase& c : layout_cases(use))
      out.push_back(c);
  return out;
}

/// The dense layouts of the whole-model tests: every tensor mode (1D with and without
/// sequence parallelism, 2D, 3D), pipeline schedule, data parallelism (with ZeRO-1) and
/// context parallelism, and their combinations (the allocation and context cases).
inline std::vector<LayoutCase> dense_layout_cases() {
  return layout_cases({"allocations", "context"});
}

/// The [parallel] lines of the table's cases that `use` runs at this job's world size, in
/// the table's order.
inline std::vector<std::string> layouts(const std::string& use) {
  std::vector<std::string> out;
  for (const LayoutCase& c : layout_cases(use))
    out.push_back(c.parallel);
  return out;
}

/// A case on one line for traces: its [parallel] lines ("one process" without), its
/// [model] lines and its sequences per micro-batch where it sets them.
inline std::string describe(const LayoutCase& c) {
  std::string d = (c.parallel.empty() ? "one process" : c.parallel) +
                  (c.model.empty() ? "" : "\n" + c.model) +
                  (c.sequences == 0 ? "" : "\nsequences = " + std::to_string(c.sequences));
  std::replace(d.begin(), d.end(), '\n', ' ');
  return d;
}

/// The cases of `use` at this job's world size; a world size the table has none for fails.
inline std::vector<LayoutCase> required_cases(const std::string& use) {
  std::vector<LayoutCase> out = layout_cases(use);
  if (out.empty())
    ADD_FAILURE() << "no \"" << use << "\" cases for " << world_size()
                  << " ranks: add them to tests/layouts.hpp";
  return out;
}

/// A case's deck: `base` (the test's model and training) with the case's [model] and
/// [parallel] lines, and a global batch of its sequences per micro-batch (`sequences`
/// unless the case says) for every replica and micro-batch.
inline Deck case_deck(DeckText base, const LayoutCase& c, int sequences,
                      const std::string& source) {
  base.lines("model", c.model).lines("parallel", c.parallel);
  const int per = c.sequences == 0 ? sequences : c.sequences;
  return base
      .set("train.global_batch",
           per * base.get("parallel.data_size", 1) * base.get("parallel.microbatches", 1))
      .deck(source);
}

/// The same case on one process: its replicas' micro-batches in turn.
inline LayoutCase on_one_process(const LayoutCase& c) {
  DeckText lines;
  lines.lines("parallel", c.parallel);
  LayoutCase one = c;
  one.parallel = "microbatches = " + std::to_string(lines.get("parallel.data_size", 1) *
                                                    lines.get("parallel.microbatches", 1));
  return one;
}

} // namespace cubelm::testing
