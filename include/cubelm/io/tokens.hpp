#pragma once
/// \file
/// \brief Token files: readers and writers for llm.c `.bin`, Megatron
/// `.bin` + `.idx` and raw text. File formats: docs/data.md.
///
/// A corpus is read whole into host memory as int32 tokens. Every way a file
/// can be wrong is a cubelm::Error (not collective: only the rank that reads
/// the file sees it) whose message names the file, the byte offset or token
/// index, the value found and the rule it breaks.

#include "cubelm/core/config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cubelm::io {

/// \brief A corpus in memory and where it came from (for messages and logs).
struct TokenData {
  std::string source;               ///< the file(s) read, e.g. "data/c.bin" or "data/c.{bin,idx}"
  std::vector<std::int32_t> tokens; ///< every token in [0, vocab_size)
};

/// \brief Reads an llm.c token file; every token must be < vocab_size.
std::vector<std::int32_t> read_llmc(const std::string& path, int vocab_size);
/// \brief Reads a Megatron `.bin` + `.idx` pair (path: prefix or either file)
/// and concatenates its sequences in index order; every token must be in
/// [0, vocab_size).
std::vector<std::int32_t> read_megatron(const std::string& path, int vocab_size);
/// \brief Reads a file's bytes as tokens; every byte must be < vocab_size.
std::vector<std::int32_t> read_text(const std::string& path, int vocab_size = 256);

/// \brief Reads a short list of token ids, such as a prompt: an llm.c token file (a file
/// that starts with its magic number), or else decimal ids separated by whitespace.
/// Every id must be in [0, vocab_size); a word that is not a decimal number is an Error
/// naming its position and byte offset. An empty file gives no tokens.
std::vector<std::int32_t> read_token_ids(const std::string& path, int vocab_size);

/// \brief The tokens a corpus holds, from its headers alone (llm.c: the header; Megatron:
/// the index, each sequence checked to lie inside the .bin; text: the size), with the
/// readers' checks of them; the tokens themselves (their range) are not read.
std::int64_t token_count(const std::string& format, const std::string& path);

/// \brief Reads a corpus; `format` is "llmc", "megatron" or "text".
TokenData load_tokens(const std::string& format, const std::string& path, int vocab_size);

/// \brief How a run's tokens divide between training and held-out validation
/// (data.val_path, data.val_fraction; docs/training.md#validation).
struct TokenSplit {
  std::int64_t train = 0;      ///< training tokens: the corpus less its held-out tail
  std::int64_t validation = 0; ///< validation tokens; 0 when the deck names none
  int batches = 0;             ///< validation global batches: eval.batches, or fewer when the
                               ///< validation tokens hold fewer without repeating any
};

/// \brief The split of a corpus of `corpus` tokens; `val_file` is the token count of
/// data.val_path (unused without one). A part too small for its use is a collective
/// cubelm::Error naming the key, the counts and the rule: the training tokens must hold
/// model.seq_len + 2 (the samplers' rule), the validation tokens one global batch
/// (train.global_batch x model.seq_len + 2).
TokenSplit split_tokens(const Deck& deck, std::int64_t corpus, std::int64_t val_file = 0);

/// \brief Writes an llm.c token file; refuses tokens outside [0, 65535].
void write_llmc(const std::string& path, const std::vector<std::int32_t>& tokens);
/// \brief Writes prefix.bin and prefix.idx, one sequence per document.
///
/// The dtype is uint16 (code 8) when every token fits, int32 (code 4)
/// otherwise; negative tokens are refused. As Megatron's own writer does, the
/// document index array has D = documents + 1 entries 0, 1, .., S, so that
/// document d is sequences [index[d], index[d+1]).
void write_megatron(const std::string& prefix,
                    const std::vector<std::vector<std::int32_t>>& documents);
/// \brief Concatenates the bytes of text files into one llm.c file (byte
/// vocabulary, 256) and returns the token count; backs `cubelm data`.
std::int64_t text_to_llmc(const std::vector<std::string>& inputs, const std::string& output);

} // namespace cubelm::io
