// GPT-2's byte-level BPE: the vocabulary files, the pre-tokeniser and the encoder
// (docs/data.md, "GPT-2 byte-level BPE"). The merge rule is tiktoken's: of all adjacent
// parts of a piece, the two whose concatenation is the mergeable token of lowest rank
// merge first (the leftmost of equals), until no concatenation is a mergeable token.

#include "cubelm/io/bpe.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/io/json.hpp"
#include "token_format.hpp"
#include "unicode_classes.hpp"

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

constexpr std::int32_t kNoRank = std::numeric_limits<std::int32_t>::max();
// Ids are kept in tables indexed by id: a sparse id far out would cost memory for
// nothing, so ids stop at 2^24 - 1 (GPT-2's end at 50256).
constexpr std::int64_t kMaxId = (std::int64_t{1} << 24) - 1;
constexpr const char* kEndOfText = "<|endoftext|>";

// A 64-bit hash of a short byte string, eight bytes at a time.
inline std::uint64_t hash_bytes(const unsigned char* p, std::size_t n) {
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  std::uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0x94D049BB133111EBull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
}

inline const unsigned char* bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

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

inline CharClass class_of(std::uint32_t cp) {
  if (cp < kDirectClasses)
    return static_cast<CharClass>((kDirectClassBits[cp >> 2] >> (2 * (cp & 3))) & 3);
  std::uint32_t lo = 0, hi = kClassRangeCount;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (kClassRanges[mid].last < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < kClassRangeCount && kClassRanges[lo].first <= cp ? kClassRanges[lo].cls : kOther;
}

struct CodePoint {
  CharClass cls;
  std::uint32_t length; // bytes
};

inline bool continuation(unsigned char c) {
  return (c & 0xC0) == 0x80;
}

// The code point at s[i]: a well-formed UTF-8 sequence (Unicode's Table 3-7: no
// overlong forms, no surrogates, nothing above U+10FFFF), or else the single byte s[i]
// as a code point of class kOther.
inline CodePoint code_point_at(const unsigned char* s, std::size_t n, std::size_t i) {
  const unsigned c = s[i];
  if (c < 0x80)
    return {class_of(c), 1};
  if (c >= 0xC2 && c <= 0xDF) {
    if (i + 1 < n && continuation(s[i + 1]))
      return {class_of(((c & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu)), 2};
  } else if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    if (i + 2 < n && s[i + 1] >= lo && s[i + 1] <= hi && continuation(s[i + 2]))
      return {class_of(((c & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu)), 3};
  } else if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    if (i + 3 < n && s[i + 1] >= lo && s[i + 1] <= hi && continuation(s[i + 2]) &&
        continuation(s[i + 3]))
      return {class_of(((c & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) |
                       ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3Fu)),
              4};
  }
  return {kOther, 1};
}

// The end of the piece of GPT-2's regex that starts at s[i] (i < n):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// The alternatives are tried in order, so a contraction wins at an apostrophe; a
// space followed by a letter, number or other code point starts a run of that class;
// a run of white space followed by more text leaves its last code point to the next
// piece (the lookahead), unless the run is that one code point.
inline std::size_t piece_end(const unsigned char* s, std::size_t n, std::size_t i) {
  if (s[i] == '\'' && i + 1 < n) {
    const unsigned char a = s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
      return i + 2;
    if (i + 2 < n) {
      const unsigned char b = s[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return i + 3;
    }
  }
  const CodePoint first = code_point_at(s, n, i);
  std::size_t j = i + first.length;
  CharClass run = first.cls;
  if (s[i] == ' ' && j < n) {
    const CodePoint second = code_point_at(s, n, j);
    if (second.cls != kSpace) {
      run = second.cls;
      j += second.length;
    }
  }
  if (run != kSpace) {
    while (j < n) {
      const CodePoint c = code_point_at(s, n, j);
      if (c.cls != run)
        break;
      j += c.length;
    }
    return j;
  }
  std::size_t last = i; // where the run's last code point starts
  while (j < n) {
    const CodePoint c = code_point_at(s, n, j);
    if (c.cls != kSpace)
      break;
    last = j;
    j += c.length;
  }
  return j == n || last == i ? j : last;
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

/// Everything a loaded vocabulary holds.
struct BpeTables {
  std::string source;
  std::string arena;                 // every token's bytes, one after the other
  std::vector<std::uint32_t> offset; // id -> where its bytes start in arena
  std::vector<std::int32_t> length;  // id -> its byte count; -1 when no token has the id
  std::int32_t byte_id[256] = {};    // the id of each single byte
  std::int32_t end_of_text = 0;

  // The mergeable tokens of two or more bytes: bytes -> (rank, id). Those of two bytes
  // in tables indexed by the bytes, the longer ones in an open-addressing table whose
  // slots are small (a tag of the hash and an entry's number), so that most of it stays
  // in the processor's caches.
  struct Entry {
    std::uint32_t offset, length;
    std::int32_t rank, id;
  };
  std::vector<std::int32_t> pair_rank, pair_id; // [first byte << 8 | second byte]
  std::vector<Entry> entries;
  std::vector<std::uint64_t> slots; // hash >> 32 << 32 | entry + 1; 0: an empty slot
  std::uint64_t mask = 0;
  std::uint32_t longest = 0; // the longest mergeable token, in bytes
  // One bit per hash value's bits 40..59, set for each entry: most byte strings that are
  // no token are turned away here, in 128 KiB, without reading the slots.
  std::vector<std::uint64_t> filter;
  static std::uint64_t filter_bit(std::uint64_t h) { return (h >> 40) & 0xFFFFFu; }

  // The entry of the mergeable token p[0, n), n > 2, whose hash is h; nullptr if none.
  const Entry* find(const unsigned char* p, std::size_t n, std::uint64_t h) const {
    const std::uint64_t bit = filter_bit(h);
    if ((filter[bit >> 6] >> (bit & 63) & 1) == 0)
      return nullptr;
    const std::uint64_t tag = h >> 32;
    for (std::uint64_t i = h & mask;; i = (i + 1) & mask) {
      const std::uint64_t v = slots[i];
      if (v == 0)
        return nullptr;
      if ((v >> 32) == tag) {
        const Entry& e = entries[(v & 0xFFFFFFFFu) - 1];
        if (e.length == n && std::memcmp(arena.data() + e.offset, p, n) == 0)
          return &e;
      }
    }
  }
  std::int32_t rank(const unsigned char* p, std::size_t n) const {
    if (n == 2)
      return pair_rank[(p[0] << 8) | p[1]];
    if (n > longest)
      return kNoRank;
    const Entry* e = find(p, n, hash_bytes(p, n));
    return e != nullptr ? e->rank : kNoRank;
  }
  // The id of a piece's part after merging: a single byte or a mergeable token.
  std::int32_t id_of_part(const unsigned char* p, std::size_t n) const {
    if (n == 1)
      return byte_id[*p];
    if (n == 2)
      return pair_id[(p[0] << 8) | p[1]];
    const Entry* e = find(p, n, hash_bytes(p, n));
    CUBELM_ASSERT(e != nullptr, "a merged part is a mergeable token");
    return e->id;
  }
  // The id of a whole piece of two or more bytes with hash h when it is a mergeable
  // token, else -1.
  std::int32_t id_of_whole(const unsigned char* p, std::size_t n, std::uint64_t h) const {
    if (n == 2)
      return pair_rank[(p[0] << 8) | p[1]] == kNoRank ? -1 : pair_id[(p[0] << 8) | p[1]];
    if (n > longest)
      return -1;
    const Entry* e = find(p, n, h);
    return e != nullptr ? e->id : -1;
  }

  // Builds the id tables from (id, bytes) and the mergeable table from (id, rank) of
  // tokens of two or more bytes. Every single byte must have a token.
  void build(const std::vector<std::pair<std::int32_t, std::string>>& tokens,
             const std::vector<std::pair<std::int32_t, std::int32_t>>& mergeable) {
    std::int32_t limit = end_of_text + 1;
    for (const auto& t : tokens)
      limit = std::max(limit, t.first + 1);
    offset.assign(static_cast<std::size_t>(limit), 0);
    length.assign(static_cast<std::size_t>(limit), -1);
    std::fill(std::begin(byte_id), std::end(byte_id), -1);
    for (const auto& [id, b] : tokens) {
      offset[id] = static_cast<std::uint32_t>(arena.size());
      length[id] = static_cast<std::int32_t>(b.size());
      arena += b;
      if (b.size() == 1)
        byte_id[static_cast<unsigned char>(b[0])] = id;
    }
    for (int b = 0; b < 256; ++b)
      if (byte_id[b] < 0) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02X", b);
        fail(source, std::string("no token is the single byte ") + hex +
                         ": a byte-level BPE vocabulary has a token for each of the 256 bytes");
      }
    pair_rank.assign(65536, kNoRank);
    pair_id.assign(65536, -1);
    std::uint64_t capacity = 16;
    while (capacity < 2 * mergeable.size() + 2)
      capacity *= 2;
    slots.assign(capacity, 0);
    mask = capacity - 1;
    filter.assign((std::size_t{1} << 20) / 64, 0);
    for (const auto& [id, r] : mergeable) {
      const auto* p = bytes(arena) + offset[id];
      const auto n = static_cast<std::uint32_t>(length[id]);
      if (n == 2) {
        pair_rank[(p[0] << 8) | p[1]] = r;
        pair_id[(p[0] << 8) | p[1]] = id;
        continue;
      }
      entries.push_back(Entry{offset[id], n, r, id});
      const std::uint64_t h = hash_bytes(p, n);
      std::uint64_t i = h & mask;
      while (slots[i] != 0)
        i = (i + 1) & mask;
      slots[i] = (h >> 32 << 32) | entries.size();
      filter[filter_bit(h) >> 6] |= std::uint64_t{1} << (filter_bit(h) & 63);
      longest = std::max(longest, n);
    }
  }
};

/// An encoder's cache of pieces already encoded, and its scratch for merging.
struct BpeCache {
  // Pieces as in BpeTables: slots of a tag and an entry's number, entries with the
  // piece's bytes (in keys) and its ids (in ids).
  struct Entry {
    std::uint64_t hash;
    std::uint32_t key, key_length, ids, count;
  };
  // Pieces up to this long are cached (longer ones are rare and seldom repeat); the
  // cache starts over when it holds kMaxEntries pieces. At 2^18 its slots (4 MiB) stay
  // mostly in the processor's caches: 2^20 was no faster on English text and slower on
  // text of ever new words.
  static constexpr std::size_t kLongestCached = 128;
  static constexpr std::size_t kMaxEntries = std::size_t{1} << 18;
  std::vector<std::uint64_t> slots = std::vector<std::uint64_t>(std::size_t{1} << 14, 0);
  std::vector<Entry> entries;
  std::string keys;
  std::vector<std::int32_t> ids;

  struct Part {
    std::uint32_t start;
    std::int32_t rank;
  };
  std::vector<Part> parts;
  struct Pair {
    std::int32_t rank;
    std::uint32_t left, right, end;
  };
  std::vector<Pair> heap;
  std::vector<std::uint32_t> part_end, part_prev;

  const Entry* find(const unsigned char* p, std::size_t n, std::uint64_t h) const {
    const std::uint64_t mask = slots.size() - 1, tag = h >> 32;
    for (std::uint64_t i = h & mask;; i = (i + 1) & mask) {
      const std::uint64_t v = slots[i];
      if (v == 0)
        return nullptr;
      if ((v >> 32) == tag) {
        const Entry& e = entries[(v & 0xFFFFFFFFu) - 1];
        if (e.key_length == n && std::memcmp(keys.data() + e.key, p, n) == 0)
          return &e;
      }
    }
  }
  void place(std::uint64_t h, std::size_t number) {
    const std::uint64_t mask = slots.size() - 1;
    std::uint64_t i = h & mask;
    while (slots[i] != 0)
      i = (i + 1) & mask;
    slots[i] = (h >> 32 << 32) | number;
  }
  void insert(const unsigned char* p, std::size_t n, std::uint64_t h, const std::int32_t* first,
              std::size_t count) {
    if (entries.size() >= kMaxEntries) {
      std::fill(slots.begin(), slots.end(), 0);
      entries.clear();
      keys.clear();
      ids.clear();
    }
    if (2 * (entries.size() + 1) > slots.size()) {
      slots.assign(slots.size() * 2, 0);
      for (std::size_t k = 0; k < entries.size(); ++k)
        place(entries[k].hash, k + 1);
    }
    entries.push_back(Entry{h, static_cast<std::uint32_t>(keys.size()),
                            static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(ids.size()),
                            static_cast<std::uint32_t>(count)});
    keys.append(reinterpret_cast<const char*>(p), n);
    ids.insert(ids.end(), first, first + count);
    place(h, entries.size());
  }
};

namespace {

// Pieces up to this many bytes merge by tiktoken's scan of all parts (quadratic, fast
// when short); longer ones through a heap of candidate pairs, with the same order.
constexpr std::size_t kShortPiece = 64;

void merge_short(const BpeTables& t, BpeCache& c, const unsigned char* p, std::size_t n,
                 std::vector<std::int32_t>& out) {
  auto& parts = c.parts;
  parts.clear();
  for (std::size_t i = 0; i + 1 < n; ++i)
    parts.push_back({static_cast<std::uint32_t>(i), t.rank(p + i, 2)});
  parts.push_back({static_cast<std::uint32_t>(n - 1), kNoRank});
  parts.push_back({static_cast<std::uint32_t>(n), kNoRank});
  auto rank_from = [&](std::size_t i) {
    return i + 3 < parts.size() ? t.rank(p + parts[i].start, parts[i + 3].start - parts[i].start)
                                : kNoRank;
  };
  for (;;) {
    std::int32_t best = kNoRank;
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].rank < best) {
        best = parts[i].rank;
        at = i;
      }
    if (best == kNoRank)
      break;
    if (at > 0)
      parts[at - 1].rank = rank_from(at - 1);
    parts[at].rank = rank_from(at);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (std::size_t k = 0; k + 1 < parts.size(); ++k)
    out.push_back(t.id_of_part(p + parts[k].start, parts[k + 1].start - parts[k].start));
}

void merge_long(const BpeTables& t, BpeCache& c, const unsigned char* p, std::size_t n,
                std::vector<std::int32_t>& out) {
  // Parts are named by where they start; part_end and part_prev link them. A candidate
  // pair (left part, right part, its end) is current while both parts still have those
  // bounds; the heap pops the lowest rank, the leftmost of equals, as tiktoken's scan.
  auto& end = c.part_end;
  auto& prev = c.part_prev;
  auto& heap = c.heap;
  end.resize(n);
  prev.resize(n);
  heap.clear();
  const auto later = [](const BpeCache::Pair& a, const BpeCache::Pair& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  const auto push = [&](std::uint32_t left, std::uint32_t right, std::uint32_t stop) {
    const std::int32_t r = t.rank(p + left, stop - left);
    if (r == kNoRank)
      return;
    heap.push_back({r, left, right, stop});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (std::uint32_t i = 0; i < n; ++i) {
    end[i] = i + 1;
    prev[i] = i == 0 ? 0 : i - 1;
  }
  for (std::uint32_t i = 0; i + 1 < n; ++i)
    push(i, i + 1, i + 2);
  const auto alive = [&](std::uint32_t s) { return s == 0 || end[prev[s]] == s; };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeCache::Pair e = heap.back();
    heap.pop_back();
    if (end[e.left] != e.right || !alive(e.left) || end[e.right] != e.end || !alive(e.right))
      continue;
    end[e.left] = e.end;
    if (e.end < n)
      prev[e.end] = e.left;
    if (e.left > 0)
      push(prev[e.left], e.left, e.end);
    if (e.end < n)
      push(e.left, e.end, end[e.end]);
  }
  for (std::uint32_t s = 0; s < n; s = end[s])
    out.push_back(t.id_of_part(p + s, end[s] - s));
}

void encode_piece(const BpeTables& t, BpeCache& c, const unsigned char* p, std::size_t n,
                  std::vector<std::int32_t>& out) {
  if (n == 1) {
    out.push_back(t.byte_id[*p]);
    return;
  }
  const std::uint64_t h = hash_bytes(p, n);
  if (const std::int32_t whole = t.id_of_whole(p, n, h); whole >= 0) {
    out.push_back(whole);
    return;
  }
  const bool cached = n <= BpeCache::kLongestCached;
  if (cached) {
    if (const BpeCache::Entry* e = c.find(p, n, h)) {
      out.insert(out.end(), c.ids.begin() + e->ids, c.ids.begin() + e->ids + e->count);
      return;
    }
  }
  const std::size_t first = out.size();
  if (n <= kShortPiece)
    merge_short(t, c, p, n, out);
  else
    merge_long(t, c, p, n, out);
  if (cached)
    c.insert(p, n, h, out.data() + first, out.size() - first);
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

BpeEncoder::BpeEncoder(const Bpe& bpe)
    : tables_(bpe.tables_), cache_(std::make_unique<BpeCache>()) {}
BpeEncoder::~BpeEncoder() = default;
BpeEncoder::BpeEncoder(BpeEncoder&&) noexcept = default;
BpeEncoder& BpeEncoder::operator=(BpeEncoder&&) noexcept = default;

void BpeEncoder::encode(std::string_view text, std::vector<std::int32_t>& out) {
  const unsigned char* s = bytes(text);
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const std::size_t j = piece_end(s, n, i);
    encode_piece(*tables_, *cache_, s + i, j - i, out);
    i = j;
  }
}

std::vector<std::int32_t> BpeEncoder::encode(std::string_view text) {
  std::vector<std::int32_t> out;
  encode(text, out);
  return out;
}

std::vector<std::string> gpt2_pieces(std::string_view text) {
  std::vector<std::string> pieces;
  const unsigned char* s = bytes(text);
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t j = piece_end(s, text.size(), i);
    pieces.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return pieces;
}

std::size_t gpt2_cut(std::string_view text, std::size_t from) {
  // An ASCII byte is a code point of its own however the bytes before it decode, so
  // decoding from one stays in step with decoding from the start.
  const unsigned char* s = bytes(text);
  const std::size_t n = text.size();
  std::size_t i = from;
  while (i < n && s[i] >= 0x80)
    ++i;
  if (i >= n)
    return n;
  CharClass previous = code_point_at(s, n, i).cls;
  for (++i; i < n;) {
    const CodePoint c = code_point_at(s, n, i);
    if (c.cls == kSpace && previous != kSpace)
      return i;
    previous = c.cls;
    i += c.length;
  }
  return n;
}

const char* bpe_unicode_version() {
  return kUnicodeVersion;
}

} // namespace cubelm::io
