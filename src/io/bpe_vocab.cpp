// GPT-2's byte-level BPE: its vocabulary files, tiktoken's ranks and Hugging Face's
// vocab.json with merges.txt (docs/data.md, "GPT-2 byte-level BPE"), and what the
// loaded vocabulary answers.

#include "cubelm/io/bpe.hpp"

#include "bpe_tables.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/io/json.hpp"
#include "token_format.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>
#include <utility>

namespace cubelm::io {

namespace detail {

namespace {

// A token's bytes for a message: printable ASCII as it is, other bytes as \xNN,
// quoted, cut after 40 bytes.
std::string shown(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 32 && c < 127 && c != '\\' && c != '\'')
      out += static_cast<char>(c);
    else
      out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
  }
  return out + (s.size() > 40 ? "...'" : "'");
}
std::string read_file(const std::string& path, const std::string& kind) {
  InFile f(path, kind);
  std::string text(static_cast<std::size_t>(f.size()), '\0');
  if (!text.empty())
    f.read(0, text.data(), text.size());
  return text;
}

// The lines of a text, numbered from 1, without their "\n" or "\r\n".
class Lines {
public:
  explicit Lines(std::string_view text) : text_(text) {}
  bool next(std::string_view& line) {
    if (pos_ >= text_.size())
      return false;
    std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos)
      end = text_.size();
    line = text_.substr(pos_, end - pos_);
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    pos_ = end + 1;
    ++number_;
    return true;
  }
  std::size_t number() const { return number_; }

private:
  std::string_view text_;
  std::size_t pos_ = 0, number_ = 0;
};

// A decimal integer in [0, kMaxId] with nothing else around it.
bool parse_id(std::string_view s, std::int64_t& value) {
  if (s.empty() || s.size() > 12)
    return false;
  value = 0;
  for (char c : s) {
    if (c < '0' || c > '9')
      return false;
    value = value * 10 + (c - '0');
  }
  return value <= kMaxId;
}

// Strict base64 (RFC 4648, standard alphabet): a multiple of four characters, '='
// only as the last one or two.
bool decode_base64(std::string_view s, std::string& out) {
  out.clear();
  if (s.empty() || s.size() % 4 != 0)
    return false;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z')
      return c - 'A';
    if (c >= 'a' && c <= 'z')
      return c - 'a' + 26;
    if (c >= '0' && c <= '9')
      return c - '0' + 52;
    if (c == '+')
      return 62;
    if (c == '/')
      return 63;
    return -1;
  };
  for (std::size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i + k];
      if (c == '=' && last && k >= 2 && (k == 3 || s[i + 3] == '=')) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = value(c)) < 0)
        return false;
    }
    const std::uint32_t bits = (std::uint32_t(v[0]) << 18) | (std::uint32_t(v[1]) << 12) |
                               (std::uint32_t(v[2]) << 6) | std::uint32_t(v[3]);
    out += static_cast<char>(bits >> 16);
    if (pad < 2)
      out += static_cast<char>((bits >> 8) & 0xFF);
    if (pad < 1)
      out += static_cast<char>(bits & 0xFF);
  }
  return true;
}

// GPT-2's bytes_to_unicode: the character vocab.json and merges.txt write each byte
// as. Printable Latin-1 bytes stand for themselves; the other 68 bytes, in order, for
// U+0100, U+0101, ...
struct ByteCharacters {
  std::uint32_t of_byte[256];
  std::int32_t byte_of[0x100 + 68]; // -1 where no byte
  ByteCharacters() {
    std::fill(std::begin(byte_of), std::end(byte_of), -1);
    std::uint32_t extra = 0;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      of_byte[b] = printable ? b : 0x100 + extra++;
      byte_of[of_byte[b]] = static_cast<std::int32_t>(b);
    }
  }
};

const ByteCharacters& byte_characters() {
  static const ByteCharacters table;
  return table;
}

// The bytes of a string of vocab.json or merges.txt, given as UTF-8 code points;
// false when a code point is not one of GPT-2's 256 byte characters (`bad` says which).
bool unmap_bytes(const std::vector<std::uint32_t>& cps, std::string& out, std::uint32_t& bad) {
  const ByteCharacters& bc = byte_characters();
  out.clear();
  for (std::uint32_t cp : cps) {
    if (cp >= 0x100 + 68 || bc.byte_of[cp] < 0) {
      bad = cp;
      return false;
    }
    out += static_cast<char>(bc.byte_of[cp]);
  }
  return true;
}

std::string hex_code_point(std::uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "U+%04X", cp);
  return buf;
}

// Strict UTF-8 to code points; false on a byte that starts no well-formed sequence.
bool utf8_code_points(std::string_view s, std::vector<std::uint32_t>& cps, std::size_t& bad) {
  cps.clear();
  const unsigned char* p = bytes(s);
  for (std::size_t i = 0; i < s.size();) {
    const unsigned c = p[i];
    std::uint32_t cp;
    std::size_t len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else {
      const CodePoint probe = code_point_at(p, s.size(), i);
      len = probe.length;
      if (len == 1) {
        bad = i;
        return false;
      }
      cp = c & (len == 2 ? 0x1Fu : len == 3 ? 0x0Fu : 0x07u);
      for (std::size_t k = 1; k < len; ++k)
        cp = (cp << 6) | (p[i + k] & 0x3Fu);
    }
    cps.push_back(cp);
    i += len;
  }
  return true;
}

} // namespace

} // namespace detail

using namespace detail;

Bpe::Bpe(std::shared_ptr<const BpeTables> tables) : tables_(std::move(tables)) {}

Bpe Bpe::load(const std::string& name, const std::string& vocab_path,
              const std::string& merges_path) {
  if (name != "gpt2")
    throw Error("--bpe " + name +
                ": no such BPE; cubelm knows gpt2 (GPT-2's byte-level BPE, r50k_base)");
  if (ends_with(vocab_path, ".json")) {
    std::string merges = merges_path;
    if (merges.empty())
      merges = (fs::path(vocab_path).parent_path() / "merges.txt").string();
    const std::string vocab = read_file(vocab_path, "BPE vocabulary (vocab.json)");
    return from_vocab_merges(
        vocab,
        read_file(merges, "BPE merges file (merges.txt beside vocab.json, or --merges FILE)"),
        vocab_path, merges);
  }
  if (!merges_path.empty())
    throw Error("--merges " + merges_path + ": a merges file goes with a vocab.json; " +
                vocab_path + " is read as a .tiktoken ranks file, which holds the merges itself");
  return from_tiktoken(read_file(vocab_path, "BPE ranks file (.tiktoken)"), vocab_path);
}

Bpe Bpe::from_tiktoken(std::string_view text, const std::string& source) {
  auto t = std::make_shared<BpeTables>();
  t->source = source;
  std::vector<std::pair<std::int32_t, std::string>> tokens;
  std::unordered_map<std::string, std::size_t> line_of_token;
  std::unordered_map<std::int64_t, std::size_t> line_of_rank;
  Lines lines(text);
  std::string_view line;
  std::string token;
  std::int64_t largest = -1;
  const std::string rule = ": a .tiktoken ranks file has one token a line, its bytes in base64, "
                           "a space and its rank";
  while (lines.next(line)) {
    if (line.empty())
      continue;
    const std::string at = "line " + ustr(lines.number()) + ": ";
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      fail(source, at + shown(line) + " is not two fields" + rule);
    const std::string_view code = line.substr(0, space), number = line.substr(space + 1);
    if (!decode_base64(code, token))
      fail(source, at + shown(code) +
                       " is not base64 (A-Z, a-z, 0-9, + and /, padded with = to a multiple of "
                       "4 characters)" +
                       rule);
    std::int64_t rank = 0;
    if (!parse_id(number, rank))
      fail(source, at + "the rank " + shown(number) + " is not an integer in [0, " + str(kMaxId) +
                       "]" + rule);
    if (const auto it = line_of_rank.find(rank); it != line_of_rank.end())
      fail(source, at + "rank " + str(rank) + " is also the rank of line " + ustr(it->second) +
                       ": each rank names one token");
    if (const auto it = line_of_token.find(token); it != line_of_token.end())
      fail(source, at + "the token " + shown(token) + " is also on line " + ustr(it->second) +
                       ": each token has one rank");
    line_of_rank.emplace(rank, lines.number());
    line_of_token.emplace(token, lines.number());
    largest = std::max(largest, rank);
    tokens.emplace_back(static_cast<std::int32_t>(rank), token);
  }
  if (tokens.empty())
    fail(source, "no tokens" + rule);
  if (largest + 1 > kMaxId)
    fail(source, "rank " + str(largest) + " leaves no id for " + kEndOfText +
                     " (the id after the largest rank), which must be at most " + str(kMaxId));
  t->end_of_text = static_cast<std::int32_t>(largest + 1);
  std::vector<std::pair<std::int32_t, std::int32_t>> mergeable;
  for (const auto& [id, b] : tokens)
    if (b.size() >= 2)
      mergeable.emplace_back(id, id);
  tokens.emplace_back(t->end_of_text, kEndOfText);
  t->build(tokens, mergeable);
  return Bpe(std::move(t));
}

Bpe Bpe::from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                           const std::string& vocab_source, const std::string& merges_source) {
  auto t = std::make_shared<BpeTables>();
  t->source = vocab_source + " with " + merges_source;
  std::vector<std::pair<std::int32_t, std::string>> tokens;
  std::unordered_map<std::string, std::int32_t> id_of;
  // vocab.json through the JSON reader, which refuses a syntax error and a key written
  // twice with the line and column; then each member, named by its key.
  const Json vocab = parse_json(std::string(vocab_json), vocab_source);
  const std::string vocab_rule =
      ": vocab.json must be one JSON object of token strings to integer ids";
  if (!vocab.is_object())
    fail(vocab_source, "the document is " + vocab.describe() + ", not an object" + vocab_rule);
  std::unordered_map<std::int64_t, const std::string*> key_of_id;
  std::vector<std::uint32_t> cps;
  std::string b;
  bool have_end = false;
  for (const auto& [key, value] : vocab.members()) {
    const std::string token = "the token " + json_quote(key);
    const std::optional<std::uint64_t> id = value.unsigned_integer();
    if (!id || *id > static_cast<std::uint64_t>(kMaxId))
      fail(vocab_source, "the id of " + token + " is " + value.describe() +
                             ", not an integer in [0, " + str(kMaxId) + "]" + vocab_rule);
    std::size_t bad_at = 0;
    std::uint32_t bad = 0;
    if (!utf8_code_points(key, cps, bad_at))
      fail(vocab_source, "the token " + shown(key) + " is not UTF-8" + vocab_rule);
    if (!unmap_bytes(cps, b, bad))
      fail(vocab_source, token + " has the character " + hex_code_point(bad) +
                             ", which is none of the 256 characters GPT-2's byte-level "
                             "vocabulary writes bytes as");
    if (b.empty())
      fail(vocab_source, token + " is empty" + vocab_rule);
    // No token appears twice: parse_json refuses a key written twice, and distinct keys
    // are distinct tokens (each byte has one character). Ids can repeat.
    const auto [it, fresh] = key_of_id.emplace(static_cast<std::int64_t>(*id), &key);
    if (!fresh)
      fail(vocab_source, "the tokens " + json_quote(*it->second) + " and " + json_quote(key) +
                             " both have id " + ustr(*id) + ": each id names one token");
    id_of.emplace(b, static_cast<std::int32_t>(*id));
    tokens.emplace_back(static_cast<std::int32_t>(*id), b);
    if (b == kEndOfText) {
      have_end = true;
      t->end_of_text = static_cast<std::int32_t>(*id);
    }
  }
  if (!have_end)
    fail(vocab_source, std::string("no token ") + kEndOfText +
                           ": cubelm writes it between documents, with the id vocab.json gives");

  std::vector<std::pair<std::int32_t, std::int32_t>> mergeable;
  std::unordered_map<std::int32_t, std::size_t> line_of_result;
  Lines lines(merges_txt);
  std::string_view line;
  std::string left, right;
  const std::string rule = ": merges.txt has one merge a line, two tokens of vocab.json separated "
                           "by one space";
  while (lines.next(line)) {
    if (line.empty() || (lines.number() == 1 && line.substr(0, 9) == "#version:"))
      continue;
    const std::string at = "line " + ustr(lines.number()) + ": ";
    const std::size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      fail(merges_source, at + shown(line) + " is not two tokens" + rule);
    for (int side = 0; side < 2; ++side) {
      const std::string_view part = side == 0 ? line.substr(0, space) : line.substr(space + 1);
      std::string& out = side == 0 ? left : right;
      std::size_t bad_at = 0;
      std::uint32_t bad = 0;
      if (!utf8_code_points(part, cps, bad_at))
        fail(merges_source, at + shown(part) + " is not UTF-8" + rule);
      if (!unmap_bytes(cps, out, bad))
        fail(merges_source, at + shown(part) + " has the character " + hex_code_point(bad) +
                                ", which is none of the 256 characters GPT-2's byte-level "
                                "vocabulary writes bytes as");
      if (id_of.count(out) == 0)
        fail(merges_source, at + "the token " + shown(part) + " is not in " + vocab_source + rule);
    }
    const auto result = id_of.find(left + right);
    if (result == id_of.end())
      fail(merges_source, at + "the merge makes " + shown(left + right) + ", which is not in " +
                              vocab_source + ": every merge makes a token of the vocabulary");
    if (const auto it = line_of_result.find(result->second); it != line_of_result.end())
      fail(merges_source, at + "the merge makes " + shown(left + right) + ", which line " +
                              ustr(it->second) +
                              " makes already: cubelm ranks a merge by the token it makes "
                              "(as tiktoken does), so each token comes from one merge");
    line_of_result.emplace(result->second, lines.number());
    mergeable.emplace_back(result->second, static_cast<std::int32_t>(mergeable.size()));
  }
  t->build(tokens, mergeable);
  return Bpe(std::move(t));
}

const std::string& Bpe::source() const {
  return tables_->source;
}

std::int32_t Bpe::end_of_text() const {
  return tables_->end_of_text;
}

std::int32_t Bpe::id_limit() const {
  return static_cast<std::int32_t>(tables_->length.size());
}

bool Bpe::has(std::int32_t id) const {
  return id >= 0 && id < id_limit() && tables_->length[id] >= 0;
}

std::string_view Bpe::bytes_of(std::int32_t id) const {
  CUBELM_ASSERT(has(id), "bytes_of an id of the vocabulary");
  return std::string_view(tables_->arena).substr(tables_->offset[id], tables_->length[id]);
}

std::string Bpe::decode(const std::vector<std::int32_t>& ids) const {
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (!has(ids[i]))
      fail(source(), "id " + str(ids[i]) + " (at " + ustr(i) +
                         ") names no token of the vocabulary (ids 0.." + str(id_limit() - 1) + ")");
    text += bytes_of(ids[i]);
  }
  return text;
}

} // namespace cubelm::io
