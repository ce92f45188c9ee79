// GPT-2's byte-level BPE: the pre-tokeniser and the encoder (docs/data.md, "GPT-2
// byte-level BPE"; the vocabulary files are read in bpe_vocab.cpp). The merge rule is tiktoken's:
// of all adjacent parts of a piece, the two whose concatenation is the mergeable token of lowest
// rank merge first (the leftmost of equals), until no concatenation is a mergeable token.

#include "cubelm/io/bpe.hpp"

#include "bpe_tables.hpp"
#include "cubelm/core/error.hpp"
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

} // namespace

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
    return probe(slots, slots.size() - 1, h, entries, [&](const Entry& e) {
      return e.key_length == n && std::memcmp(keys.data() + e.key, p, n) == 0;
    });
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
