// The `cubelm` command: parses the command line and runs one subcommand.

#include "cubelm/app/commands.hpp"
#include "cubelm/app/generate.hpp"
#include "cubelm/app/hf.hpp"
#include "cubelm/app/plan.hpp"
#include "cubelm/core/environment.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/core/version.hpp"
#include "cubelm/kernels/blas.hpp"

#include <CLI/CLI.hpp>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

// One rank prints a user error when all ranks hit it together; otherwise the
// rank that hit it reports and aborts the job so that nobody waits forever.
int report(const std::exception& e, bool collective, int rank, int world) {
  if (collective) {
    if (rank == 0)
      std::fprintf(stderr, "cubelm: error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "cubelm: rank %d: error: %s\n", rank, e.what());
  std::fflush(stderr);
  if (world > 1)
    MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

// The rank a launcher gave this process, read before MPI is up: mpiexec (Open MPI,
// MPICH, PMIx) and srun export it. 0 when started alone.
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0')
      return std::atoi(v);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  // A build for wider vector instructions than this processor has stops here with a
  // message, not at its first such instruction. The BLAS picked its kernels when it loaded: where
  // they are below the processor, this executes cubelm again with OPENBLAS_CORETYPE set
  // (kernels/blas.hpp), before MPI, Kokkos or any output start.
  if (const std::string wrong = cubelm::kernels::kernels_isa_mismatch(cubelm::cpu_features());
      !wrong.empty()) {
    if (launcher_rank() == 0)
      std::fprintf(stderr, "cubelm: error: %s\n", wrong.c_str());
    return 1;
  }
  const auto kernels = cubelm::kernels::ensure_blas_kernels(argv);
  if (!kernels.warning.empty() && launcher_rank() == 0)
    std::fprintf(stderr, "cubelm: warning: %s\n", kernels.warning.c_str());
  // `cubelm --version` needs neither MPI nor a device: it answers before either is
  // brought up, so that it also runs where a CUDA build finds no GPU.
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    if (launcher_rank() == 0)
      std::printf("%s", cubelm::app::version_text().c_str());
    return 0;
  }
  // `cubelm check --json` prints one JSON object on stdout: Kokkos' start-up warnings
  // (which go to stdout too) are switched off for it.
  // `cubelm plan` uses no device at all: its output stays free of them too.
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0 || std::strcmp(argv[i], "plan") == 0)
      setenv("KOKKOS_DISABLE_WARNINGS", "1", 0);
  // checkpoint.async writes from a second thread, which MPI must allow from MPI_Init on.
  cubelm::Environment env(argc, argv, cubelm::app::train_wants_mpi_threads(argc, argv));
  const int rank = env.world_rank();

  CLI::App app{"cubelm " CUBELM_VERSION_STRING
               ": GPT training with 1D, 2D and 3D tensor parallelism, pipeline and data "
               "parallelism.\nLaunch with mpiexec or srun; Kokkos options (--kokkos-*) are "
               "accepted too.",
               "cubelm"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "Print the version and build configuration, then exit");

  std::string check_deck;
  CLI::App* check = app.add_subcommand(
      "check", "Validate a deck and print its layout, model size and work per step");
  check->add_option("deck", check_deck, "The TOML input deck")->required();
  bool check_as_json = false;
  check->add_flag("--json", check_as_json,
                  "Print one JSON object (layout, sizes, memory, closed-form traffic per step)");

  std::string check_machine;
  check->add_option("--machine", check_machine,
                    "A machine file: also print the predicted step time (docs/planner.md)");

  cubelm::app::PlanOptions plan_options;
  CLI::App* plan = app.add_subcommand(
      "plan", "Rank every layout of a deck's model on N devices of a machine by predicted step "
              "time, memory and traffic (docs/planner.md); --calibrate measures this machine");
  plan->add_option("deck", plan_options.deck, "The TOML input deck (model, batch, precision)");
  plan->add_option("--machine", plan_options.machine, "The machine file (TOML)");
  plan->add_option("--ranks", plan_options.ranks,
                   "Devices to lay out (default: the deck's own layout's)");
  plan->add_option("--top", plan_options.top, "Layouts printed (default 10)");
  plan->add_flag("--json", plan_options.json, "Every layout, one JSON object per line");
  plan->add_option("--precision", plan_options.precisions,
                   "train.precision values to try (default: the deck's)")
      ->delimiter(',');
  plan->add_option("--mode", plan_options.modes, "Tensor modes to try (default: all)")
      ->delimiter(',');
  plan->add_option("--tensor-size", plan_options.tensor_sizes,
                   "Tensor sizes to keep (default: any)")
      ->delimiter(',');
  plan->add_option("--pipeline-size", plan_options.pipeline_sizes,
                   "Pipeline sizes to keep (default: any)")
      ->delimiter(',');
  plan->add_option("--context-size", plan_options.context_sizes,
                   "Context sizes to try (default: the deck's)")
      ->delimiter(',');
  plan->add_option("--recompute", plan_options.recompute,
                   "recompute settings to keep: none, full (default: both)")
      ->delimiter(',');
  plan->add_flag("--calibrate", plan_options.calibrate,
                 "Measure this machine (run under mpiexec) and write a machine file");
  plan->add_option("-o,--output", plan_options.output, "--calibrate: the machine file to write");

  std::string train_deck;
  CLI::App* train = app.add_subcommand(
      "train", "Train the deck's model, printing one line per log interval (rank 0)");
  train->add_option("deck", train_deck, "The TOML input deck")->required();

  std::string init_deck, init_output;
  CLI::App* init = app.add_subcommand(
      "init", "Write the deck's initialised model as a step-0 checkpoint (HDF5)");
  init->add_option("deck", init_deck, "The TOML input deck")->required();
  init->add_option("-o,--output", init_output, "The checkpoint file to write (.h5)")->required();

  cubelm::app::DataOptions data_options;
  CLI::App* data = app.add_subcommand(
      "data", "Turn text files into an llm.c .bin token file: one token per byte, or GPT-2's "
              "BPE (--bpe gpt2 --vocab FILE) with <|endoftext|> between the files; or a token "
              "file back into text (--decode T.bin)");
  data->add_option("inputs", data_options.inputs,
                   "Text files, in the order given; under --bpe each is one document");
  data->add_option("-o,--output", data_options.output,
                   "The .bin file to write; with --decode the text file (default: standard "
                   "output)");
  data->add_option("--bpe", data_options.bpe,
                   "Tokenise with a byte-level BPE: gpt2 (GPT-2's, r50k_base; needs --vocab). "
                   "Without it each byte is a token (vocabulary 256)");
  data->add_option("--vocab", data_options.vocab,
                   "The BPE's ranks: a .tiktoken file, or Hugging Face's vocab.json (read with "
                   "the merges.txt beside it)");
  data->add_option("--merges", data_options.merges,
                   "Hugging Face's merges.txt, when it is not beside vocab.json");
  data->add_option("--threads", data_options.threads,
                   "Encoding threads (default: every CPU this process may run on)")
      ->check(CLI::Range(1, 4096));
  data->add_option("--progress", data_options.progress,
                   "Seconds between the progress lines of a BPE conversion on stderr (default "
                   "2; 0: none)");
  data->add_option("--decode", data_options.decode,
                   "Write the text of this llm.c token file: the tokens of --vocab, or bytes "
                   "without it");

  std::string convert_to, convert_from, convert_input, convert_output;
  CLI::App* convert = app.add_subcommand(
      "convert", "Convert a model between a cubelm checkpoint and a Hugging Face GPT-2 "
                 "directory (model.safetensors and config.json, as transformers' "
                 "GPT2LMHeadModel loads them); runs on one process (docs/training.md)");
  convert
      ->add_option("--to", convert_to,
                   "hf: write the model of the checkpoint INPUT as the directory OUTPUT")
      ->check(CLI::IsMember({"hf"}));
  convert
      ->add_option("--from", convert_from,
                   "hf: write the model of the directory INPUT as the step-0 checkpoint "
                   "OUTPUT (.h5; zero optimizer moments)")
      ->check(CLI::IsMember({"hf"}));
  convert->add_option("input", convert_input, "The checkpoint (--to) or directory (--from) to read")
      ->required();
  convert
      ->add_option("-o,--output", convert_output,
                   "The directory (--to) or checkpoint (--from) to write")
      ->required();

  std::vector<std::string> verify_files;
  CLI::App* verify = app.add_subcommand(
      "verify", "Verify checkpoint files: read every dataset and check its checksums "
                "(exit 1 if any file is damaged)");
  verify->add_option("files", verify_files, "Checkpoint files (.h5)")->required();

  cubelm::app::GenerateOptions gen_options;
  std::string gen_prompt;
  CLI::App* gen = app.add_subcommand(
      "generate", "Generate text from a checkpoint of any layout, on one process with a "
                  "key/value cache, or under a deck's layout with --deck (docs/generate.md); "
                  "tokens go to stdout as they come");
  gen->add_option("checkpoint", gen_options.checkpoint, "The checkpoint file (.h5)")->required();
  CLI::Option* gen_text =
      gen->add_option("--prompt", gen_prompt,
                      "The prompt as text: its BPE tokens with --vocab, else its bytes for a "
                      "byte-vocabulary model (model.vocab_size = 256, as `cubelm data` writes)");
  gen->add_option("--prompt-tokens", gen_options.prompt_tokens,
                  "The prompt as token ids: an llm.c token file, or decimal ids separated "
                  "by whitespace");
  gen->add_option("--vocab", gen_options.vocab,
                  "A BPE vocabulary (.tiktoken ranks, or vocab.json with merges.txt beside it "
                  "or --merges), as `cubelm data --bpe gpt2` took: the prompt is encoded and "
                  "the tokens printed as text");
  gen->add_option("--merges", gen_options.merges, "merges.txt, when not beside vocab.json");
  gen->add_option("--tokens", gen_options.tokens, "Tokens to generate (default 32)");
  gen->add_option("--logits", gen_options.logits,
                  "Write the logits each token was drawn from to this file: one row of "
                  "model.vocab_size float32 (little-endian) per generated token");
  gen->add_option("--deck", gen_options.deck,
                  "Generate under this deck's layout (tensor, pipeline, context, expert) on "
                  "the job's processes (mpiexec -n N), for a model one device cannot hold: "
                  "each token runs the whole context, no key/value cache");
  gen->add_option("--temperature", gen_options.sampling.temperature,
                  "Sample from softmax(logits / T); 0: greedy, the most probable token "
                  "(default 1)");
  gen->add_option("--top-k", gen_options.sampling.top_k,
                  "Sample among the K most probable tokens only (default 0: all)");
  gen->add_option("--top-p", gen_options.sampling.top_p,
                  "Then among the fewest most probable tokens whose probability reaches P, in "
                  "(0, 1] (default 1: all)");
  gen->add_option("--seed", gen_options.sampling.seed,
                  "Seed of the sampling's random numbers (default 1)");

  // A first word that is no command: say so (CLI11 would say the argument was not expected).
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      if (rank == 0)
        std::fprintf(stderr, "cubelm: no such command '%s'; the commands are %s (cubelm --help)\n",
                     argv[1], names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same command line; one of them explains.
    if (rank == 0)
      return app.exit(e);
    return e.get_exit_code();
  }

  try {
    if (version) {
      if (rank == 0)
        std::printf("%s", cubelm::app::version_text().c_str());
      return 0;
    }
    if (*check || *train || *init) {
      // Once per node, before any work: a bad placement costs speed, not results.
      for (const std::string& w : env.placement_warnings())
        std::fprintf(stderr, "cubelm: warning: %s\n", w.c_str());
      std::fflush(stderr);
    }
    if (*check)
      return cubelm::app::run_check(check_deck, env, check_as_json, check_machine);
    if (*plan) {
      if (plan_options.deck.empty() && !plan_options.calibrate)
        throw cubelm::Error("cubelm plan needs a deck (cubelm plan DECK --machine FILE)", true);
      return cubelm::app::run_plan(plan_options, env);
    }
    if (*train)
      return cubelm::app::run_train(train_deck, env);
    if (*init)
      return cubelm::app::run_init(init_deck, init_output, env);
    if (*data)
      return cubelm::app::run_data(data_options, env);
    if (*verify)
      return cubelm::app::run_verify(verify_files, env);
    if (*convert)
      return cubelm::app::run_convert(convert_to, convert_from, convert_input, convert_output, env);
    if (*gen) {
      if (*gen_text)
        gen_options.prompt = gen_prompt;
      return cubelm::app::run_generate(gen_options, env);
    }
    if (rank == 0)
      std::printf("%s", app.help().c_str());
    return 0;
  } catch (const cubelm::Error& e) {
    return report(e, e.collective(), rank, env.world_size());
  } catch (const std::exception& e) {
    return report(e, false, rank, env.world_size());
  }
}
