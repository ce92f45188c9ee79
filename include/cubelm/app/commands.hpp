#pragma once
/// \file
/// \brief The subcommands of the `cubelm` program, callable from tests too.

#include "cubelm/core/config.hpp"
#include "cubelm/core/environment.hpp"

#include <string>
#include <vector>

namespace cubelm::app {

/// \brief The text of `cubelm --version`: versions of cubelm and of every library it uses.
std::string version_text();

/// \brief `cubelm check DECK`: validates the deck and prints the layout and sizes.
///
/// Run on one process it checks the layout's shape and says how many processes
/// it needs; run under mpiexec it also checks that the job has that many.
/// With `json` it prints one JSON object instead (check_json). With a machine file
/// (`machine_path`) it adds the planner's prediction for the deck's layout
/// (docs/planner.md; in JSON the key "prediction").
/// \return the exit code (0 when the deck is valid); user errors are thrown.
int run_check(const std::string& deck_path, const Environment& env, bool json = false,
              const std::string& machine_path = "");

/// \brief `cubelm check DECK --json`: the deck's layout, parameters, tokens and FLOPs per
/// step, the fullest rank's memory estimate (`mem_bytes`, and by kind) and rank 0's
/// closed-form traffic per step (`comm_bytes`, and `comm` by group.kind), the same
/// quantities as the training metrics.
std::string check_json(const Deck& deck, const std::string& deck_path);

/// \brief `cubelm train DECK`: validates the deck, then trains (train/trainer.hpp).
int run_train(const std::string& deck_path, const Environment& env);

/// \brief Whether the command line is `cubelm train DECK` with a deck that sets
/// checkpoint.async = true: then MPI must grant MPI_THREAD_MULTIPLE, which is chosen
/// before MPI starts. Reads the deck; one that does not read answers false (run_train
/// then reports it).
bool train_wants_mpi_threads(int argc, char** argv);

/// \brief `cubelm init DECK -o FILE`: the step-0 checkpoint (model, zero moments, attributes).
int run_init(const std::string& deck_path, const std::string& output, const Environment& env);

/// \brief What `cubelm data` is asked to do (docs/data.md).
struct DataOptions {
  std::vector<std::string> inputs; ///< text files, one document each, in order
  std::string output;              ///< the .bin to write; with `decode` the text ("": stdout)
  std::string bpe;                 ///< "" for the byte vocabulary, or "gpt2"
  std::string vocab;               ///< the BPE's .tiktoken ranks file or vocab.json
  std::string merges;              ///< merges.txt when not beside vocab.json
  std::string decode;              ///< an llm.c token file to turn back into text
  int threads = 0;                 ///< encoding threads; 0: every CPU the process may use
  double progress = 2;             ///< seconds between progress lines (BPE); 0: none
};

/// \brief `cubelm data TEXT... -o OUT.bin [--bpe gpt2 --vocab FILE]`: the text files as an
/// llm.c token file, one token per byte or GPT-2's BPE with `<|endoftext|>` between the
/// files; `cubelm data --decode T.bin [--vocab FILE] [-o TEXT]`: the text of a token file.
/// Rank 0 does the work.
int run_data(const DataOptions& options, const Environment& env);

/// \brief `cubelm verify FILE...`: reads every dataset of each checkpoint, verifying its
/// checksums; prints one line per file. Returns 0 when every file is sound, 1 otherwise.
int run_verify(const std::vector<std::string>& files, const Environment& env);

/// \brief The summary `cubelm check` prints for a validated deck.
std::string describe(const Deck& deck);

} // namespace cubelm::app
