#pragma once
// What GPT-2's byte-level BPE shares between its vocabulary readers (bpe_vocab.cpp) and
// its encoder (bpe.cpp): the loaded tables, the byte hashes, UTF-8 code points and their
// classes. Internal to src/io.

#include "cubelm/core/error.hpp"

#include "token_format.hpp"
#include "unicode_classes.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cubelm::io::detail {

inline constexpr std::int32_t kNoRank = std::numeric_limits<std::int32_t>::max();
// Ids are kept in tables indexed by id: a sparse id far out would cost memory for
// nothing, so ids stop at 2^24 - 1 (GPT-2's end at 50256).
inline constexpr std::int64_t kMaxId = (std::int64_t{1} << 24) - 1;
inline constexpr const char* kEndOfText = "<|endoftext|>";

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

// The open-addressing tables of the vocabulary and of an encoder's cache: slots of a
// 64-bit value, the hash's upper half as a tag and an entry's number + 1 (0: empty),
// probed linearly from the hash's low bits (mask = slots - 1). The entry whose tag
// matches and for which same(entry) holds, or nullptr.
template <class Entry, class Same>
const Entry* probe(const std::vector<std::uint64_t>& slots, std::uint64_t mask, std::uint64_t h,
                   const std::vector<Entry>& entries, const Same& same) {
  const std::uint64_t tag = h >> 32;
  for (std::uint64_t i = h & mask;; i = (i + 1) & mask) {
    const std::uint64_t v = slots[i];
    if (v == 0)
      return nullptr;
    if ((v >> 32) == tag && same(entries[(v & 0xFFFFFFFFu) - 1]))
      return &entries[(v & 0xFFFFFFFFu) - 1];
  }
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
    return probe(slots, mask, h, entries, [&](const Entry& e) {
      return e.length == n && std::memcmp(arena.data() + e.offset, p, n) == 0;
    });
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

} // namespace cubelm::io::detail
