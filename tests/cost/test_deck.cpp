// The input deck: defaults, every key, and each kind of error message
// (which must name the file, the line, the key, the value and the rule).

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace cubelm;
using namespace cubelm::cost;

namespace {

// The message of the collective Error that parsing `text` raises.
std::string error_of(const std::string& text) {
  try {
    parse_deck(text, "deck.toml");
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective()) << "deck errors are the same on every rank";
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

#define EXPECT_HAS(haystack, needle)                                                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                                 \
      << "message: " << (haystack) << "\nmissing: " << (needle)

} // namespace

TEST(Deck, EmptyDeckGivesTheDocumentedDefaults) {
  const Deck d = parse_deck("");
  EXPECT_EQ(d.model.vocab_size, 256);
  EXPECT_EQ(d.model.seq_len, 64);
  EXPECT_EQ(d.model.hidden, 64);
  EXPECT_EQ(d.model.heads, 4);
  EXPECT_EQ(d.model.layers, 2);
  EXPECT_EQ(d.parallel.tensor_mode, TensorMode::none);
  EXPECT_EQ(comm::layout_of(d.parallel).world_size(), 1);
  EXPECT_EQ(d.parallel.schedule, Schedule::one_f_one_b);
  EXPECT_EQ(d.train.global_batch, 8);
  EXPECT_EQ(d.micro_batch(), 8);
  EXPECT_DOUBLE_EQ(d.optimizer.lr, 6e-4);
  EXPECT_DOUBLE_EQ(d.optimizer.min_lr, 6e-5);
  EXPECT_DOUBLE_EQ(d.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(d.optimizer.eps, 1e-8);
  EXPECT_EQ(d.data.format, "synthetic");
  EXPECT_EQ(d.data.sampler, "shuffle");
  EXPECT_EQ(d.checkpoint.resume, "none");
  EXPECT_EQ(d.checkpoint.dir, "checkpoints"); // a deck given as text
  EXPECT_FALSE(d.checkpoint.allow_other_run);
  EXPECT_FALSE(d.checkpoint.async);
  EXPECT_EQ(d.checkpoint.on_error, "fail");
  EXPECT_EQ(d.checkpoint.writers, "all");
  EXPECT_EQ(d.log.interval, 1);
  EXPECT_DOUBLE_EQ(d.parallel.timeout_s, 600.0);
}

// Each deck file writes into checkpoints/<its name> unless it says otherwise.
TEST(Deck, CheckpointDirectoryDefaultsToTheDeckName) {
  EXPECT_EQ(cost::parse_deck("", "inputs/quickstart.toml").checkpoint.dir,
            "checkpoints/quickstart");
  EXPECT_EQ(cost::parse_deck("", "/abs/run.v2.toml").checkpoint.dir, "checkpoints/run.v2");
  EXPECT_EQ(cost::parse_deck("[checkpoint]\ndir = \"mine\"\n", "a.toml").checkpoint.dir, "mine");
  EXPECT_TRUE(cost::parse_deck("[checkpoint]\nallow_other_run = true\n", "a.toml")
                  .checkpoint.allow_other_run);
}

TEST(Deck, ReadsEveryKey) {
  const std::string text = R"(
[model]
vocab_size = 512
seq_len = 32
hidden = 96
heads = 6
layers = 4
[parallel]
tensor_mode = "2d"
tensor_size = 4
pipeline_size = 2
data_size = 2
schedule = "interleaved"
virtual_stages = 2
microbatches = 4
zero = 1
sequence_parallel = false
recompute = "full"
timeout_s = 120
[train]
steps = 7
global_batch = 16
seed = 99
[optimizer]
lr = 1e-3
min_lr = 0
warmup_steps = 3
weight_decay = 0.05
beta1 = 0.8
beta2 = 0.9
eps = 1e-6
grad_clip = 0.5
[data]
format = "llmc"
path = "train.bin"
sampler = "sequential"
[checkpoint]
dir = "ck"
interval = 5
keep = 2
resume = "auto"
[log]
interval = 2
metrics = "m.jsonl"
)";
  const Deck d = parse_deck(text, "full.toml");
  EXPECT_EQ(d.text, text);
  EXPECT_EQ(d.source, "full.toml");
  EXPECT_EQ(d.model.hidden, 96);
  EXPECT_EQ(d.parallel.tensor_mode, TensorMode::d2);
  EXPECT_EQ(comm::layout_of(d.parallel).world_size(), 16);
  EXPECT_EQ(d.parallel.virtual_stages, 2);
  EXPECT_EQ(d.parallel.zero, 1);
  EXPECT_EQ(d.parallel.recompute, Recompute::full);
  EXPECT_DOUBLE_EQ(d.parallel.timeout_s, 120.0);
  EXPECT_EQ(d.train.seed, 99);
  EXPECT_EQ(d.micro_batch(), 2);
  EXPECT_DOUBLE_EQ(d.optimizer.min_lr, 0.0); // integer accepted for a float key
  EXPECT_DOUBLE_EQ(d.optimizer.grad_clip, 0.5);
  EXPECT_EQ(d.data.path, "train.bin");
  EXPECT_EQ(d.checkpoint.keep, 2);
  EXPECT_EQ(d.log.metrics, "m.jsonl");
}

TEST(Deck, UnknownKeyNamesLineAndSuggestion) {
  const std::string m = error_of("[model]\nhidden = 64\nhiden = 32\n");
  EXPECT_HAS(m, "deck.toml:3:");
  EXPECT_HAS(m, "unknown key 'model.hiden'");
  EXPECT_HAS(m, "did you mean 'hidden'");
}

TEST(Deck, UnknownSection) {
  const std::string m = error_of("[modle]\nhidden = 64\n");
  EXPECT_HAS(m, "deck.toml:1: unknown section [modle]");
  EXPECT_HAS(m, "did you mean [model]");
  EXPECT_HAS(error_of("steps = 3\n"), "unknown section [steps]");
  EXPECT_HAS(error_of("model = 3\n"), "'model' must be a table");
}

TEST(Deck, WrongTypes) {
  EXPECT_HAS(error_of("[model]\nhidden = \"64\"\n"),
             "deck.toml:2: model.hidden = \"64\": must be an integer, got string");
  EXPECT_HAS(error_of("[optimizer]\nlr = \"fast\"\n"), "optimizer.lr = \"fast\": must be a number");
  EXPECT_HAS(error_of("[parallel]\nsequence_parallel = 1\n"), "must be true or false");
  EXPECT_HAS(error_of("[data]\npath = 3\n"), "data.path = 3: must be a string");
  EXPECT_HAS(error_of("[model]\nlayers = 1.5\n"), "must be an integer");
  EXPECT_HAS(error_of("[train]\nsteps = 3000000000\n"), "must fit a 32-bit integer");
}

// Background checkpoints: three float32 copies (values and both moments) of the rank's
// parameters in host memory, apart from the device's total.
TEST(Deck, BackgroundCheckpointBuffersAreEstimated) {
  const Deck sync = cost::parse_deck("[parallel]\ntensor_mode = \"1d\"\ntensor_size = 2\n");
  const Deck async = cost::parse_deck(
      "[parallel]\ntensor_mode = \"1d\"\ntensor_size = 2\n[checkpoint]\nasync = true\n"
      "on_error = \"warn\"\n");
  EXPECT_TRUE(async.checkpoint.async);
  EXPECT_EQ(async.checkpoint.on_error, "warn");
  const cost::Memory a = cost::estimate_memory(async), s = cost::estimate_memory(sync);
  EXPECT_EQ(s.checkpoint_buffers, 0);
  EXPECT_EQ(a.checkpoint_buffers, 3 * a.parameters); // fp32: 4 bytes a parameter
  EXPECT_EQ(a.total(), s.total());
  // Under ZeRO-1 the values and this rank's shard of the moments: two of the optimizer's
  // three floats per element of its shard (both moments and the gradient's piece).
  const Deck zero =
      cost::parse_deck("[parallel]\ndata_size = 4\nzero = 1\n[checkpoint]\nasync = true\n");
  const cost::Memory z = cost::estimate_memory(zero);
  EXPECT_EQ(z.optimizer % 3, 0);
  EXPECT_EQ(z.checkpoint_buffers, z.parameters + 2 * z.optimizer / 3);
  EXPECT_LT(z.checkpoint_buffers, 2 * z.parameters);
}

TEST(Deck, RulesNameTheValueAndTheRule) {
  EXPECT_HAS(error_of("[model]\nhidden = 100\nheads = 3\n"),
             "deck.toml:2: model.hidden = 100: must be divisible by model.heads = 3");
  EXPECT_HAS(error_of("[parallel]\ntensor_mode = \"4d\"\n"),
             "parallel.tensor_mode = \"4d\": must be one of \"none\", \"1d\", \"2d\", \"3d\"");
  EXPECT_HAS(error_of("[parallel]\ntensor_mode = \"3d\"\ntensor_size = 4\n"),
             "deck.toml:3: parallel.tensor_size = 4");
  EXPECT_HAS(error_of("[parallel]\ntensor_mode = \"3d\"\ntensor_size = 4\n"),
             "1 (1x1x1) or 8 (2x2x2)");
  EXPECT_HAS(error_of("[parallel]\ntensor_size = 2\n"), "needs parallel.tensor_size = 1");
  EXPECT_HAS(error_of("[parallel]\ndata_size = 0\n"), "parallel.data_size = 0: must be at least 1");
  EXPECT_HAS(error_of("[parallel]\ndata_size = 3\n[train]\nglobal_batch = 8\n"),
             "train.global_batch = 8: must be divisible by parallel.data_size x "
             "parallel.microbatches = 3 x 1 = 3");
  EXPECT_HAS(error_of("[parallel]\nvirtual_stages = 2\n"), "needs schedule = \"interleaved\"");
  EXPECT_HAS(error_of("[model]\nlayers = 8\n[parallel]\nschedule = \"interleaved\"\n"
                      "pipeline_size = 4\nmicrobatches = 6\n[train]\nglobal_batch = 12\n"),
             "parallel.microbatches = 6: schedule = \"interleaved\" needs microbatches divisible "
             "by pipeline_size = 4");
  EXPECT_HAS(error_of("[model]\nlayers = 6\n[parallel]\nschedule = \"interleaved\"\n"
                      "pipeline_size = 2\nvirtual_stages = 2\nmicrobatches = 2\n[train]\n"
                      "global_batch = 4\n"),
             "model.layers = 6: schedule = \"interleaved\" needs layers divisible by "
             "pipeline_size x virtual_stages = 2 x 2");
  EXPECT_HAS(error_of("[model]\nlayers = 2\n[parallel]\npipeline_size = 4\n"),
             "parallel.pipeline_size = 4: model.layers = 2: every pipeline stage needs a layer");
  EXPECT_HAS(error_of("[parallel]\nzero = 2\n"), "must be 0 (off) or 1");
  EXPECT_HAS(error_of("[parallel]\nsequence_parallel = true\n"), "only for tensor_mode = \"1d\"");
  EXPECT_HAS(error_of("[optimizer]\nlr = 1e-3\nmin_lr = 1e-2\n"), "must lie in [0, optimizer.lr]");
  EXPECT_HAS(error_of("[optimizer]\nbeta2 = 1.0\n"), "optimizer.beta2 = 1.0: must lie in [0, 1)");
  EXPECT_HAS(error_of("[optimizer]\neps = 0\n"), "optimizer.eps = 0: must be positive");
  EXPECT_HAS(error_of("[data]\nformat = \"llmc\"\n"), "needs data.path");
  EXPECT_HAS(error_of("[data]\nsampler = \"random\"\n"), "\"sequential\", \"shuffle\"");
  EXPECT_HAS(error_of("[checkpoint]\ninterval = -1\n"), "checkpoint.interval = -1");
  EXPECT_HAS(error_of("[checkpoint]\non_error = \"ignore\"\n"),
             "checkpoint.on_error = \"ignore\": must be one of \"fail\", \"warn\"");
  EXPECT_HAS(error_of("[checkpoint]\nwriters = \"some\"\n"),
             "checkpoint.writers = \"some\": must be one of \"all\", \"one\"");
  EXPECT_HAS(error_of("[checkpoint]\nasync = 1\n"), "checkpoint.async");
  EXPECT_HAS(error_of("[log]\ninterval = 0\n"), "log.interval = 0: must be at least 1");
}

// Held-out validation (docs/training.md#validation): defaults, keys and their rules.
TEST(Deck, ValidationKeys) {
  const Deck none = parse_deck("");
  EXPECT_FALSE(none.data.validates());
  EXPECT_EQ(none.eval.interval, 0);
  EXPECT_EQ(none.eval.batches, 8);
  const Deck d = parse_deck("[data]\nval_fraction = 0.1\n[eval]\ninterval = 50\nbatches = 4\n");
  EXPECT_TRUE(d.data.validates());
  EXPECT_DOUBLE_EQ(d.data.val_fraction, 0.1);
  EXPECT_EQ(d.eval.interval, 50);
  EXPECT_EQ(d.eval.batches, 4);
  EXPECT_EQ(parse_deck("[data]\nformat = \"llmc\"\npath = \"a.bin\"\nval_path = \"b.bin\"\n")
                .data.val_path,
            "b.bin");
  EXPECT_HAS(error_of("[data]\nval_fraction = 0.6\n"),
             "deck.toml:2: data.val_fraction = 0.6: must lie in [0, 0.5]");
  EXPECT_HAS(error_of("[data]\nformat = \"llmc\"\npath = \"a.bin\"\nval_path = \"b.bin\"\n"
                      "val_fraction = 0.1\n"),
             "data.val_path = \"b.bin\": and data.val_fraction both name validation tokens");
  EXPECT_HAS(error_of("[data]\nval_path = \"b.bin\"\n"),
             "data.val_fraction to hold out part of the synthetic corpus");
  EXPECT_HAS(error_of("[eval]\ninterval = 10\n"),
             "deck.toml:2: eval.interval = 10: needs validation tokens: set data.val_path or "
             "data.val_fraction");
  EXPECT_HAS(error_of("[data]\nval_fraction = 0.1\n[eval]\nbatches = 0\n"),
             "eval.batches = 0: must be at least 1");
  EXPECT_HAS(error_of("[eval]\nbatch = 2\n"), "unknown key 'eval.batch'; did you mean 'batches'?");
}

// parallel.context_size (docs/grid.md#context-parallelism): 2 x context_size equal chunks
// of model.seq_len; the error lists the sizes that fit, and expert_size divides the
// replicas data_size x context_size.
TEST(Deck, ContextParallelRules) {
  const Deck d = parse_deck("[model]\nseq_len = 16\n[parallel]\ncontext_size = 4\n");
  EXPECT_EQ(d.parallel.context_size, 4);
  EXPECT_EQ(parse_deck("[model]\nseq_len = 16\n").parallel.context_size, 1);
  EXPECT_HAS(error_of("[model]\nseq_len = 12\n[parallel]\ncontext_size = 4\n"),
             "deck.toml:4: parallel.context_size = 4: must split model.seq_len = 12 into 2 x "
             "context_size equal chunks (2 x 4 = 8 must divide it); valid: 1, 2, 3, 6");
  EXPECT_HAS(error_of("[model]\nseq_len = 16\n[parallel]\ncontext_size = 0\n"),
             "parallel.context_size = 0: must be at least 1");
  EXPECT_HAS(error_of("[model]\nseq_len = 16\nexperts = 4\n[parallel]\ncontext_size = 2\n"
                      "expert_size = 4\n"),
             "parallel.expert_size = 4: must divide both data_size x context_size = 1 x 2 = 2");
  EXPECT_EQ(parse_deck("[model]\nseq_len = 16\nexperts = 4\n[parallel]\ncontext_size = 2\n"
                       "data_size = 2\nexpert_size = 4\n[train]\nglobal_batch = 2\n")
                .parallel.expert_size,
            4);
  // Sequence parallelism splits the rank's tokens: micro-batch x seq_len / context_size.
  EXPECT_HAS(
      error_of("[model]\nseq_len = 4\nhidden = 12\nheads = 3\n[parallel]\ntensor_mode = \"1d\"\n"
               "tensor_size = 3\nsequence_parallel = true\ncontext_size = 2\n[train]\n"
               "global_batch = 1\n"),
      "model.seq_len / context_size = 2) divisible by 3");
}

// parallel.timeout_s, the hang watchdog's limit (docs/reliability.md): seconds, 0 for
// off; a negative, NaN or infinite value is refused naming the key, its line, the
// value and the rule.
TEST(Deck, WatchdogTimeout) {
  EXPECT_DOUBLE_EQ(parse_deck("[parallel]\ntimeout_s = 0\n").parallel.timeout_s, 0.0);
  EXPECT_DOUBLE_EQ(parse_deck("[parallel]\ntimeout_s = 2.5\n").parallel.timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(parse_deck("[parallel]\ntimeout_s = 3600\n").parallel.timeout_s, 3600.0);
  const std::string rule =
      "must be a finite number of seconds, at least 0 (0 switches the hang watchdog off)";
  EXPECT_HAS(error_of("[parallel]\ntimeout_s = -1\n"),
             "deck.toml:2: parallel.timeout_s = -1: " + rule);
  EXPECT_HAS(error_of("[parallel]\ntensor_mode = \"none\"\ntimeout_s = -0.5\n"),
             "deck.toml:3: parallel.timeout_s = -0.5: " + rule);
  EXPECT_HAS(error_of("[parallel]\ntimeout_s = nan\n"), "parallel.timeout_s = nan: " + rule);
  EXPECT_HAS(error_of("[parallel]\ntimeout_s = inf\n"), "parallel.timeout_s = inf: " + rule);
  EXPECT_HAS(error_of("[parallel]\ntimeout_s = \"10m\"\n"),
             "parallel.timeout_s = \"10m\": must be a number, got string");
  EXPECT_HAS(error_of("[parallel]\ntimeout = 5\n"), "did you mean 'timeout_s'");
}

// The pipeline rules are the schedule's own (pipeline::check_plan), reported at the
// line of the parallel key, with its value, or its default when the deck omits it.
TEST(Deck, PipelineRulesAreTheSchedulesRules) {
  EXPECT_HAS(error_of("[parallel]\npipeline_size = 0\n"),
             "deck.toml:2: parallel.pipeline_size = 0: must be at least 1");
  EXPECT_HAS(error_of("[parallel]\nmicrobatches = 0\n"),
             "deck.toml:2: parallel.microbatches = 0: must be at least 1");
  EXPECT_HAS(error_of("[parallel]\nvirtual_stages = 0\n"),
             "deck.toml:2: parallel.virtual_stages = 0: must be at least 1");
  EXPECT_HAS(error_of("[parallel]\nschedule = \"layered\"\nvirtual_stages = 2\n"),
             "deck.toml:3: parallel.virtual_stages = 2: more than one virtual stage needs "
             "schedule = \"interleaved\"");
  // interleaved, microbatches % pipeline_size != 0 (here the default 1)
  EXPECT_HAS(error_of("[model]\nlayers = 4\n[parallel]\nschedule = \"interleaved\"\n"
                      "pipeline_size = 2\nvirtual_stages = 2\n"),
             "deck.toml: parallel.microbatches = 1 (default): schedule = \"interleaved\" needs "
             "microbatches divisible by pipeline_size = 2");
  EXPECT_HAS(error_of("[model]\nlayers = 8\n[parallel]\nschedule = \"interleaved\"\n"
                      "pipeline_size = 4\nmicrobatches = 6\n[train]\nglobal_batch = 12\n"),
             "deck.toml:6: parallel.microbatches = 6: schedule = \"interleaved\"");
  // interleaved, layers % (pipeline_size x virtual_stages) != 0 (here the default 2 layers)
  EXPECT_HAS(error_of("[parallel]\nschedule = \"interleaved\"\npipeline_size = 2\n"
                      "virtual_stages = 2\nmicrobatches = 2\n[train]\nglobal_batch = 4\n"),
             "deck.toml:3: parallel.pipeline_size = 2: model.layers = 2: schedule = "
             "\"interleaved\" needs layers divisible by pipeline_size x virtual_stages = 2 x 2");
  // layers < pipeline_size, for every schedule
  for (const char* s : {"gpipe", "1f1b", "interleaved", "layered"})
    EXPECT_HAS(error_of(std::string("[model]\nlayers = 3\n[parallel]\nschedule = \"") + s +
                        "\"\npipeline_size = 4\nmicrobatches = 4\n[train]\nglobal_batch = 4\n"),
               "deck.toml:5: parallel.pipeline_size = 4: model.layers = 3: every pipeline stage "
               "needs a layer (pipeline_size = 4)");
  // Uneven stages are fine for the schedules that allow them.
  for (const char* s : {"gpipe", "1f1b", "layered"}) {
    const Deck d = parse_deck(std::string("[model]\nlayers = 5\n[parallel]\nschedule = \"") + s +
                              "\"\npipeline_size = 3\nmicrobatches = 2\n[train]\n"
                              "global_batch = 4\n");
    EXPECT_EQ(d.parallel.pipeline_size, 3);
  }
}

TEST(Deck, TensorLayoutRulesSuggestSizesThatFit) {
  EXPECT_HAS(error_of("[model]\nheads = 6\nhidden = 48\nvocab_size = 96\n[parallel]\n"
                      "tensor_mode = \"1d\"\ntensor_size = 4\n"),
             "deck.toml:7: parallel.tensor_size = 4: tensor_mode = \"1d\" needs model.heads = 6 "
             "divisible by 4 (whole heads per rank); tensor sizes that fit this model: 2, 3, 6");
  // The vocabulary always splits: it is padded (to 256 here), so 250 is no obstacle.
  EXPECT_NO_THROW(parse_deck("[model]\nvocab_size = 250\n[parallel]\ntensor_mode = \"1d\"\n"
                             "tensor_size = 4\n"));
  EXPECT_HAS(error_of("[model]\nvocab_divisible_by = 0\n"), "model.vocab_divisible_by");
  // A batch that does not split is the batch's fault: the message names train.global_batch
  // and the batches that fit.
  EXPECT_HAS(error_of("[parallel]\ntensor_mode = \"2d\"\ntensor_size = 4\n[train]\n"
                      "global_batch = 3\n"),
             "deck.toml:5: train.global_batch = 3: tensor_mode = \"2d\" with tensor_size = 4 needs "
             "the micro-batch (3 sequences) divisible by 2 (whole sequences per rank); global "
             "batches that fit this layout: 2, 4, 6, 8, ...");
  EXPECT_HAS(error_of("[model]\nhidden = 30\nheads = 6\n[parallel]\ntensor_mode = \"3d\"\n"
                      "tensor_size = 8\n[train]\nglobal_batch = 8\n"),
             "model.hidden = 30 divisible by q^2 = 4");
  EXPECT_NO_THROW(parse_deck("[parallel]\ntensor_mode = \"3d\"\ntensor_size = 8\n[train]\n"
                             "global_batch = 8\n"));
}

// The file reader checks each key on its own; the layout's rules (cost/deck.hpp) come after
// it and name the line it kept, also for a key the deck leaves at its default.
TEST(Deck, LayoutRulesComeAfterReadingWithTheReadersLines) {
  const std::string text = "[model]\nheads = 6\nhidden = 48\n\n[parallel]\n"
                           "tensor_mode = \"1d\"\n# four ranks\ntensor_size = 4\n";
  const io::ReadDeck read = io::read_deck(text, "deck.toml");
  EXPECT_EQ(read.deck.parallel.tensor_size, 4);
  try {
    check_layout(read);
    ADD_FAILURE() << "heads = 6 over 4 tensor ranks was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_HAS(e.what(), "deck.toml:8: parallel.tensor_size = 4: tensor_mode = \"1d\" needs");
  }
  // Sizes below 1 are the key's own rule, refused while reading.
  try {
    (void)io::read_deck("[parallel]\nmicrobatches = 0\n", "deck.toml");
    ADD_FAILURE() << "microbatches = 0 was read";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "deck.toml:2: parallel.microbatches = 0: must be at least 1");
  }
  // A default named by a layout rule: pipeline_size = 3 needs 3 layers, the default has 2.
  EXPECT_HAS(error_of("[parallel]\npipeline_size = 3\n"),
             "deck.toml:2: parallel.pipeline_size = 3");
}

TEST(Deck, SyntaxErrorsGiveLineAndColumn) {
  const std::string m = error_of("[model]\nhidden = = 3\n");
  EXPECT_HAS(m, "deck.toml:2:");
  EXPECT_HAS(m, "not valid TOML");
}

TEST(Deck, MissingFile) {
  try {
    load_deck("/nonexistent/dir/deck.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "/nonexistent/dir/deck.toml: cannot open the deck file");
  }
}
