#pragma once
/// \file
/// \brief `cubelm plan`: every layout of a deck's model on N ranks of a machine, predicted
/// and ranked; `cubelm plan --calibrate`: measure this machine and write a machine file
/// (docs/planner.md).

#include "cubelm/core/environment.hpp"
#include "cubelm/cost/predict.hpp"
#include "cubelm/io/machine.hpp"

#include <string>
#include <vector>

namespace cubelm::app {

/// \brief The options of `cubelm plan`.
struct PlanOptions {
  std::string deck;    ///< the model, batch and other keys; its [parallel] keys are replaced
  std::string machine; ///< machine file
  int ranks = 0;       ///< devices to lay out; 0: the deck's own layout's world size
  int top = 10;        ///< layouts printed as text
  bool json = false;   ///< every layout, one JSON object per line
  std::vector<std::string> precisions; ///< train.precision values to try; empty: the deck's
  std::vector<std::string> modes;      ///< tensor modes to try; empty: all
  std::vector<int> tensor_sizes, pipeline_sizes; ///< sizes to keep; empty: any
  std::vector<int> context_sizes;                ///< context sizes to try; empty: the deck's
  std::vector<std::string> recompute;            ///< recompute settings to keep; empty: both
  bool calibrate = false;
  std::string output; ///< --calibrate: the machine file to write
};

/// \brief Runs `cubelm plan` (rank 0 prints). Returns the exit code; user errors throw.
int run_plan(const PlanOptions& options, const Environment& env);

/// \brief `cubelm plan --calibrate`, collective over the job: measures the gemm rate at the
/// deck's layer shapes (512^3 without a deck), the memory bandwidth with every rank at work,
/// and all-reduces over groups of 2, 4, ... ranks at several message sizes, fits the
/// latency and bandwidth of the node's level, and writes a machine file (rank 0).
int run_calibrate(const PlanOptions& options, const Environment& env);

/// \brief The measurements of run_calibrate as a machine (collective over MPI_COMM_WORLD;
/// `deck_path` may be empty); `report` gets the samples and the fit, as comment lines.
io::Machine measure_machine(const std::string& deck_path, std::string& report);

/// \brief The lines `cubelm check --machine` adds: predicted step time and its parts.
std::string prediction_text(const Deck& deck, const cost::Prediction& p,
                            const io::Machine& machine);

/// \brief One JSON object: "layout" (the deck's [parallel] keys), "precision", "step_ms",
/// "mem_bytes" (per rank, the fullest stage), "comm_bytes" (rank 0 per step, the metrics'
/// quantity), "fits", the time's parts ("compute_ms", "idle_ms", "optimizer_ms",
/// "comm_ms" by group), "memory" by kind, "comm" bytes by group, "tflops_per_device",
/// "mfu" and the unit-cost "bubble" of each stage.
std::string prediction_json(const Deck& deck, const cost::Prediction& p);

} // namespace cubelm::app
