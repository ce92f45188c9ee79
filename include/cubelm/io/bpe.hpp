#pragma once
/// \file
/// \brief GPT-2's byte-level BPE (r50k_base): the vocabulary files, the pre-tokeniser,
/// the encoder and decoder, and text files to llm.c token files in parallel. The rules:
/// docs/data.md, "GPT-2 byte-level BPE".
///
/// A vocabulary comes from a `.tiktoken` ranks file (one token a line: its bytes in
/// base64, a space, its rank, which is its id) or from Hugging Face's `vocab.json`
/// (token -> id, bytes written in GPT-2's byte-to-character map) with `merges.txt` (the
/// merges in order; vocab.json is read with io::parse_json). Every way such a file can
/// be wrong is a cubelm::Error (not collective) naming the file, the line (for a JSON
/// syntax error the line and column, for a vocab.json member its key), the value and
/// the rule.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cubelm::io {

namespace detail {
struct BpeTables;
struct BpeCache;
} // namespace detail

/// \brief A byte-level BPE vocabulary: mergeable tokens with their ranks, every id's
/// bytes, and the id of `<|endoftext|>`. Immutable once loaded; copies share the tables,
/// and any number of BpeEncoder may read one at once.
class Bpe {
public:
  /// \brief Loads the vocabulary of the BPE called `name` ("gpt2" is the only one).
  ///
  /// A `vocab_path` ending in `.json` is Hugging Face's vocab.json, read with the
  /// merges.txt beside it or `merges_path`; anything else is a `.tiktoken` ranks file
  /// (then `merges_path` must be empty).
  static Bpe load(const std::string& name, const std::string& vocab_path,
                  const std::string& merges_path = "");
  /// \brief A vocabulary from the text of a `.tiktoken` ranks file; `source` names it
  /// in messages. `<|endoftext|>` takes the id after the largest rank.
  static Bpe from_tiktoken(std::string_view text, const std::string& source);
  /// \brief A vocabulary from the texts of vocab.json and merges.txt. Merge k (0-based,
  /// in file order) has rank k; `<|endoftext|>` takes the id vocab.json gives it.
  static Bpe from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                               const std::string& vocab_source, const std::string& merges_source);

  /// \brief The file(s) it was read from, for messages.
  const std::string& source() const;
  /// \brief The id of `<|endoftext|>`, written between documents.
  std::int32_t end_of_text() const;
  /// \brief One more than the largest id (50257 for GPT-2).
  std::int32_t id_limit() const;
  /// \brief True when `id` names a token (ids may have gaps).
  bool has(std::int32_t id) const;
  /// \brief The bytes of token `id` (which has(id)).
  std::string_view bytes_of(std::int32_t id) const;
  /// \brief The text of `ids`; an id the vocabulary lacks is a cubelm::Error.
  std::string decode(const std::vector<std::int32_t>& ids) const;

private:
  explicit Bpe(std::shared_ptr<const detail::BpeTables> tables);
  std::shared_ptr<const detail::BpeTables> tables_;
  friend class BpeEncoder;
};

/// \brief Turns text into ids with one vocabulary; keeps a cache of pieces already
/// encoded. One per thread: an encoder is not shared between threads.
class BpeEncoder {
public:
  explicit BpeEncoder(const Bpe& bpe);
  ~BpeEncoder();
  BpeEncoder(BpeEncoder&&) noexcept;
  BpeEncoder& operator=(BpeEncoder&&) noexcept;

  /// \brief Appends the ids of `text` (any bytes; see gpt2_pieces) to `out`.
  /// `<|endoftext|>` in the text is ordinary text, never the separator's id.
  void encode(std::string_view text, std::vector<std::int32_t>& out);
  /// \brief The ids of `text`.
  std::vector<std::int32_t> encode(std::string_view text);

private:
  std::shared_ptr<const detail::BpeTables> tables_;
  std::unique_ptr<detail::BpeCache> cache_;
};

/// \brief The pieces GPT-2's regex
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` cuts
/// `text` into, in order; their concatenation is `text`. Text is read as UTF-8; a byte
/// that does not belong to a well-formed UTF-8 sequence counts as one code point that is
/// neither a letter, a number nor white space (as U+FFFD would).
std::vector<std::string> gpt2_pieces(std::string_view text);

/// \brief The first offset p >= from at which `text` can be cut so that the pieces of
/// text[0, p) and of text[p, end) are those of the whole text (a non-space code point
/// followed by a space one); text.size() when there is none.
std::size_t gpt2_cut(std::string_view text, std::size_t from);

/// \brief The Unicode version of the pre-tokeniser's letter and number tables.
const char* bpe_unicode_version();

/// \brief How far a long conversion has come (for a progress line).
struct BpeProgress {
  std::uint64_t bytes_done = 0;  ///< text bytes encoded so far
  std::uint64_t bytes_total = 0; ///< text bytes of all inputs
  double seconds = 0;            ///< since the conversion started
};

/// \brief Options of bpe_text_to_llmc.
struct BpeRunOptions {
  int threads = 1;                                  ///< encoding threads (at least 1)
  std::size_t chunk_bytes = 4u << 20;               ///< the size a file is cut into pieces near
  double progress_seconds = 2.0;                    ///< how often `progress` is called
  std::function<void(const BpeProgress&)> progress; ///< called from the calling thread
};

/// \brief What bpe_text_to_llmc wrote.
struct BpeRunResult {
  std::int64_t tokens = 0; ///< ids in the file, separators included
  std::uint64_t bytes = 0; ///< text bytes read
  double seconds = 0;      ///< wall time of the conversion
};

/// \brief Encodes each input file as one document with `bpe` and writes the ids, with
/// `<|endoftext|>` between consecutive documents, as an llm.c token file. Files are
/// cut at gpt2_cut points near every `chunk_bytes` and the pieces encoded on `threads`
/// threads; the ids are those of encoding each file whole.
BpeRunResult bpe_text_to_llmc(const Bpe& bpe, const std::vector<std::string>& inputs,
                              const std::string& output, const BpeRunOptions& options = {});

/// \brief Writes the text of an llm.c token file to `out`: the bytes of each id in
/// `bpe`, or with no vocabulary (nullptr) each id as one byte (the byte vocabulary of
/// text_to_llmc). Returns the number of ids.
std::int64_t llmc_to_text(const std::string& path, const Bpe* bpe, std::ostream& out);

} // namespace cubelm::io
