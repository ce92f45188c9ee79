#pragma once
/// \file
/// \brief What a run is asked to do: the configuration of the model, the
/// parallel layout, training, optimizer, data, checkpoints and logging, as
/// plain values with their documented defaults (docs/deck.md).
///
/// These structs know nothing of TOML, MPI or Kokkos: the deck reader (io/deck.hpp, cost/deck.hpp)
/// fills and validates them from an input deck; every layer above reads them.

#include <cstdint>
#include <optional>
#include <string>

namespace cubelm {

/// \brief The tensor-parallel mode: none, 1D (Megatron), 2D (SUMMA), 3D (cube).
enum class TensorMode { none, d1, d2, d3 };
/// \brief "none", "1d", "2d", "3d".
const char* mode_name(TensorMode mode);
/// \brief Parses "none"/"1d"/"2d"/"3d"; std::nullopt otherwise.
std::optional<TensorMode> parse_mode(const std::string& text);

/// \brief The pipeline schedule (docs/pipeline.md).
enum class Schedule { gpipe, one_f_one_b, interleaved, layered };
/// \brief "gpipe", "1f1b", "interleaved", "layered".
const char* schedule_name(Schedule schedule);
/// \brief Parses a schedule name; std::nullopt otherwise.
std::optional<Schedule> parse_schedule(const std::string& text);

/// \brief Activation recomputation.
enum class Recompute { none, full };
/// \brief "none", "full".
const char* recompute_name(Recompute recompute);
/// \brief Parses "none"/"full"; std::nullopt otherwise.
std::optional<Recompute> parse_recompute(const std::string& text);

/// \brief Arithmetic of the matrix products (docs/precision.md): fp32; tf32 (the
/// tensor cores' 19-bit inputs on NVIDIA GPUs, fp32 elsewhere); bf16 inputs with
/// fp32 accumulation. Master weights, gradients, optimizer state and every other
/// kernel stay fp32.
enum class Precision { fp32, tf32, bf16 };
const char* precision_name(Precision precision);
/// \brief Parses "fp32"/"tf32"/"bf16"; std::nullopt otherwise.
std::optional<Precision> parse_precision(const std::string& text);

struct ModelConfig {
  int vocab_size = 256;
  /// the vocabulary is padded with rows that are never predicted to a multiple of this
  /// and of the layout's vocabulary split (tp::padded_vocab), as Megatron and llm.c do
  int vocab_divisible_by = 128;
  int seq_len = 64;
  int hidden = 64;
  int heads = 4;
  int layers = 2;
  /// Mixture-of-Experts feed-forward (docs/model.md): experts per MoE layer; 0 or 1 keep
  /// the dense MLP everywhere
  int experts = 0;
  int top_k = 2;              ///< experts each token is routed to (1 <= top_k <= experts)
  int moe_every = 1;          ///< layers moe_every - 1, 2 moe_every - 1, ... are MoE layers
  double capacity_factor = 0; ///< 0: dropless; > 0: ceil(c N top_k / experts) rows per expert
  double aux_loss = 0.01;     ///< coefficient of the load-balancing loss (Switch's 0.01)
  /// \brief True when layer `layer` (from 0) has an MoE feed-forward instead of the MLP.
  bool moe_layer(int layer) const { return experts > 1 && (layer + 1) % moe_every == 0; }
};

struct ParallelConfig {
  TensorMode tensor_mode = TensorMode::none;
  int tensor_size = 1;
  int pipeline_size = 1;
  int data_size = 1;
  Schedule schedule = Schedule::one_f_one_b;
  int virtual_stages = 1;
  int microbatches = 1;
  int zero = 0;
  bool sequence_parallel = false;
  /// MoE layers: the experts spread over this many ranks (expert parallelism;
  /// docs/grid.md): tensor_size times a divisor of data_size x context_size, or with
  /// expert_tensor_size = tensor_size a divisor of data_size x context_size; it divides
  /// model.experts
  int expert_size = 1;
  /// MoE layers: each expert's hidden layer split over this many tensor ranks (expert
  /// tensor parallelism): 1 (whole experts) or tensor_size
  int expert_tensor_size = 1;
  /// attention layers: each sequence split over this many ranks (context parallelism;
  /// docs/grid.md), in 2 x context_size chunks of model.seq_len / (2 x context_size)
  int context_size = 1;
  Recompute recompute = Recompute::none;
  double bucket_mb = 25.0; ///< data-parallel gradient bucket size (MB, 10^6 bytes)
  /// seconds a blocking collective or point-to-point may go without progress before
  /// the hang watchdog aborts the job; 0 switches the watchdog off
  double timeout_s = 600.0;
};

struct TrainConfig {
  int steps = 100;
  int global_batch = 8; ///< sequences per optimizer step
  std::int64_t seed = 1234;
  /// consecutive steps with a non-finite loss or gradient norm (each skipped) before
  /// training stops with an error
  int max_bad_steps = 10;
  /// seconds after the start of `cubelm train` by which it stops with a checkpoint; 0: none
  double time_limit_s = 0;
  Precision precision = Precision::fp32; ///< of the matrix products
};

struct OptimizerConfig {
  double lr = 6e-4;
  double min_lr = 6e-5; ///< default: lr / 10
  int warmup_steps = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0; ///< 0 switches clipping off
};

struct DataConfig {
  std::string format = "synthetic";        ///< synthetic | llmc | megatron | text
  std::string path;                        ///< required unless format = "synthetic"
  std::string sampler = "shuffle";         ///< sequential | shuffle
  std::int64_t synthetic_tokens = 1 << 20; ///< corpus size for format = "synthetic"
  int synthetic_branching = 4;             ///< successors per token: entropy floor ln(branching)
  /// held-out validation tokens (docs/training.md#validation): a token file of `format`,
  /// or the last `val_fraction` of the training tokens (never sampled for training)
  std::string val_path;
  double val_fraction = 0; ///< in [0, 0.5]; 0: none (val_path may give them instead)

  /// \brief True when the deck names validation tokens.
  bool validates() const { return !val_path.empty() || val_fraction > 0; }
};

/// \brief Held-out validation (docs/training.md#validation): the loss of `batches`
/// global batches of the validation tokens, every `interval` steps and at the end.
struct EvalConfig {
  int interval = 0; ///< steps between validations; 0: at the end of the run only
  int batches = 8;  ///< global batches per validation (fewer when the tokens hold fewer)
};

struct CheckpointConfig {
  std::string dir = "checkpoints"; ///< a deck file's default: checkpoints/<its name> (io/deck)
  int interval = 0;                ///< steps between checkpoints; 0: only at the end
  int keep = 0;                    ///< how many to keep; 0: all
  std::string resume = "none";     ///< none | auto | <file>
  /// resume from a checkpoint of another run (other model keys, data, seed, batch or
  /// precision: train::run_identity), e.g. to start from its weights on new data
  bool allow_other_run = false;
  /// write checkpoints in the background: the step copies the tensors into host buffers
  /// and training goes on while a writer thread writes the file (docs/training.md)
  bool async = false;
  /// a checkpoint that cannot be written: "fail" ends the run with the error, "warn"
  /// prints it and trains on (the checkpoint at the end of the run always fails)
  std::string on_error = "fail";
  /// who writes the file: "all" ranks their own blocks through MPI-IO, or "one", the first
  /// rank, the blocks the others send it (docs/training.md#checkpoint-speed)
  std::string writers = "all";
};

struct LogConfig {
  int interval = 1;         ///< steps between printed lines
  std::string metrics;      ///< JSON-lines path; empty: none
  double peak_gflops = 0.0; ///< per-rank peak for MFU; 0: measured with a gemm at start-up
};

/// \brief A whole run's configuration (a validated deck: cost/deck.hpp).
struct Deck {
  std::string source; ///< file name (or "<string>")
  std::string text;   ///< the full text, stored in every checkpoint
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;
  EvalConfig eval;

  /// \brief Sequences per micro-batch: global_batch / (data_size * microbatches).
  int micro_batch() const {
    return train.global_batch / (parallel.data_size * parallel.microbatches);
  }
};

} // namespace cubelm
