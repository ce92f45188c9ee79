// GPT-2's byte-level BPE (io/bpe.hpp). Vocabularies are made here by hand: ranks files
// written with this file's own base64, vocab.json and merges.txt as text. The expected
// ids of the small tables are worked out by hand in the comments; the pre-tokeniser's
// pieces are written out from the regex's rules; a plain BPE written here (tiktoken's
// loop over std::string parts) checks the encoder on random text, and the round trips
// check that no byte is lost. Agreement with GPT-2's own ranks and another tokeniser:
// tests/bpe_reference.sh.

#include "cubelm/core/error.hpp"
#include "cubelm/io/bpe.hpp"
#include "cubelm/io/tokens.hpp"

#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace cubelm;
using namespace cubelm::io;
namespace fs = std::filesystem;

using cubelm::testing::TempDir;

namespace {

using Ids = std::vector<std::int32_t>;
using Pieces = std::vector<std::string>;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string base64(const std::string& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    std::uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size())
      v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size())
      v |= static_cast<unsigned char>(bytes[i + 2]);
    out += abc[(v >> 18) & 63];
    out += abc[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? abc[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? abc[v & 63] : '=';
  }
  return out;
}

/// The 256 single bytes at ranks 0..255 (rank = byte), then `merged` at 256, 257, ...
std::vector<std::pair<std::string, int>> ranks_with(const std::vector<std::string>& merged) {
  std::vector<std::pair<std::string, int>> r;
  for (int b = 0; b < 256; ++b)
    r.emplace_back(std::string(1, static_cast<char>(b)), b);
  for (const auto& m : merged)
    r.emplace_back(m, static_cast<int>(r.size()));
  return r;
}

std::string tiktoken_text(const std::vector<std::pair<std::string, int>>& ranks) {
  std::string t;
  for (const auto& [bytes, rank] : ranks)
    t += base64(bytes) + " " + std::to_string(rank) + "\n";
  return t;
}

Bpe tiktoken(const std::vector<std::pair<std::string, int>>& ranks) {
  return Bpe::from_tiktoken(tiktoken_text(ranks), "ranks.tiktoken");
}

// The first small table: 256 "ab", 257 "bc", 258 "abc", 259 "cd", 260 "bcd", 261 " a".
const std::vector<std::string> kSmall = {"ab", "bc", "abc", "cd", "bcd", " a"};

// The same table as vocab.json and merges.txt: the bytes written as GPT-2's byte
// characters (a space is U+0120, "\u0120" in JSON), ids as the ranks.
std::string small_vocab_json() {
  std::string j = "{";
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    static int extra = 0;
    if (b == 0)
      extra = 0;
    const int cp = printable ? b : 0x100 + extra++;
    char esc[16];
    std::snprintf(esc, sizeof(esc), "\\u%04x", cp);
    j += std::string("\"") + esc + "\": " + std::to_string(b) + ", ";
  }
  j += "\"ab\": 256, \"bc\": 257, \"abc\": 258, \"cd\": 259, \"bcd\": 260, \"\\u0120a\": 261, "
       "\"<|endoftext|>\": 262}";
  return j;
}
const char* kSmallMerges = "#version: 0.2\na b\nb c\nab c\nc d\nb cd\n\xc4\xa0 a\n";

// tiktoken's merge loop over std::string parts, with the shortcut for a piece that is a
// token: the reference for the encoder.
Ids plain_bpe(const std::map<std::string, int>& ranks, const std::string& piece) {
  if (const auto it = ranks.find(piece); it != ranks.end())
    return {it->second};
  std::vector<std::string> parts;
  for (char c : piece)
    parts.emplace_back(1, c);
  for (;;) {
    int best = -1;
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0)
      break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  Ids ids;
  for (const auto& p : parts)
    ids.push_back(ranks.at(p));
  return ids;
}

std::string error_of(const std::function<void()>& f) {
  return cubelm::testing::error_of(f, false);
}

Pieces pieces(const std::string& s) {
  return gpt2_pieces(s);
}

} // namespace

// ---- the pre-tokeniser ---------------------------------------------------------

TEST(Gpt2Pieces, Words) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces(""), Pieces{});
  EXPECT_EQ(pieces("a"), Pieces{"a"});
}

TEST(Gpt2Pieces, Contractions) {
  EXPECT_EQ(pieces("I'm you're we've they'll he'd it's don't"),
            (Pieces{"I", "'m", " you", "'re", " we", "'ve", " they", "'ll", " he", "'d", " it",
                    "'s", " don", "'t"}));
  // Lower case only, and only right at the apostrophe: otherwise it is punctuation.
  EXPECT_EQ(pieces("DON'T"), (Pieces{"DON", "'", "T"}));
  EXPECT_EQ(pieces("'sup"), (Pieces{"'s", "up"}));
  EXPECT_EQ(pieces("x'sy"), (Pieces{"x", "'s", "y"}));
  EXPECT_EQ(pieces(" 's"), (Pieces{" '", "s"}));
  EXPECT_EQ(pieces("''s"), (Pieces{"''", "s"}));
  EXPECT_EQ(pieces("it\xe2\x80\x99s"), (Pieces{"it", "\xe2\x80\x99", "s"})); // U+2019
  EXPECT_EQ(pieces("'l"), (Pieces{"'", "l"}));
  EXPECT_EQ(pieces("'"), (Pieces{"'"}));
}

TEST(Gpt2Pieces, WhiteSpaceRuns) {
  // A run followed by more text leaves its last code point to the next piece.
  EXPECT_EQ(pieces("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(pieces("a   \n  b"), (Pieces{"a", "   \n ", " b"}));
  EXPECT_EQ(pieces("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("a\nb"), (Pieces{"a", "\n", "b"}));
  EXPECT_EQ(pieces("a \n b"), (Pieces{"a", " \n", " b"}));
  EXPECT_EQ(pieces("a\t\tb"), (Pieces{"a", "\t", "\t", "b"}));
  // At the end of the text the whole run is one piece.
  EXPECT_EQ(pieces("end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(pieces("x \t"), (Pieces{"x", " \t"}));
  EXPECT_EQ(pieces(" "), (Pieces{" "}));
  EXPECT_EQ(pieces("\n\n\n"), (Pieces{"\n\n\n"}));
  EXPECT_EQ(pieces("  x"), (Pieces{" ", " x"}));
  EXPECT_EQ(pieces("a\x0b\x0c"
                   "b"),
            (Pieces{"a", "\x0b", "\x0c", "b"}));
  EXPECT_EQ(pieces("a\r\nb"), (Pieces{"a", "\r", "\n", "b"}));
}

TEST(Gpt2Pieces, NumbersAndPunctuation) {
  EXPECT_EQ(pieces("abc123def 456"), (Pieces{"abc", "123", "def", " 456"}));
  EXPECT_EQ(pieces("3.14"), (Pieces{"3", ".", "14"}));
  EXPECT_EQ(pieces("hello!!! ..."), (Pieces{"hello", "!!!", " ..."}));
  EXPECT_EQ(pieces(" !x"), (Pieces{" !", "x"}));
  EXPECT_EQ(pieces("(a+b)*2"), (Pieces{"(", "a", "+", "b", ")*", "2"}));
  EXPECT_EQ(pieces("<|endoftext|>"), (Pieces{"<|", "endoftext", "|>"}));
  // ½ and ² are No, Ⅻ is Nl: numbers; an Arabic-Indic digit is Nd.
  EXPECT_EQ(pieces("x\xc2\xbd\xc2\xb2\xe2\x85\xab y"),
            (Pieces{"x", "\xc2\xbd\xc2\xb2\xe2\x85\xab", " y"}));
  EXPECT_EQ(pieces(" \xd9\xa3\xd9\xa4"), (Pieces{" \xd9\xa3\xd9\xa4"}));
}

TEST(Gpt2Pieces, UnicodeLettersAndEmoji) {
  EXPECT_EQ(pieces("na\xc3\xafve caf\xc3\xa9"), (Pieces{"na\xc3\xafve", " caf\xc3\xa9"}));
  EXPECT_EQ(pieces("\xd0\x9f\xd1\x80\xd0\xb8 \xd0\xbc\xd0\xb8\xd1\x80"),
            (Pieces{"\xd0\x9f\xd1\x80\xd0\xb8", " \xd0\xbc\xd0\xb8\xd1\x80"})); // При мир
  // 日本語テキスト: all Lo, one piece.
  EXPECT_EQ(pieces("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x83\x86\xe3\x82\xad"),
            (Pieces{"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x83\x86\xe3\x82\xad"}));
  // नमस्ते: the virama (Mn) and the vowel sign (Mc) are not letters.
  EXPECT_EQ(pieces("\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87"),
            (Pieces{"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8", "\xe0\xa5\x8d", "\xe0\xa4\xa4",
                    "\xe0\xa5\x87"}));
  // Emoji are neither letters nor numbers; so are the zero-width joiner and U+FE0F.
  EXPECT_EQ(pieces("hi \xf0\x9f\x98\x80\xf0\x9f\x98\x80 ok"),
            (Pieces{"hi", " \xf0\x9f\x98\x80\xf0\x9f\x98\x80", " ok"}));
  EXPECT_EQ(pieces("\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb!"),
            (Pieces{"\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb!"}));
  // Letters outside the Basic Multilingual Plane: 𝐀 (U+1D400, Lu).
  EXPECT_EQ(pieces("a\xf0\x9d\x90\x80!"), (Pieces{"a\xf0\x9d\x90\x80", "!"}));
}

TEST(Gpt2Pieces, UnicodeWhiteSpace) {
  // No-break space and ideographic space are white space (\s).
  EXPECT_EQ(pieces("a\xc2\xa0"
                   "b"),
            (Pieces{"a", "\xc2\xa0", "b"}));
  EXPECT_EQ(pieces("\xe6\x97\xa5\xe3\x80\x80\xe8\xaa\x9e"),
            (Pieces{"\xe6\x97\xa5", "\xe3\x80\x80", "\xe8\xaa\x9e"}));
  EXPECT_EQ(pieces("a \xe2\x80\x83"
                   "b"),
            (Pieces{"a", " ", "\xe2\x80\x83", "b"}));
  // U+0085 is White_Space (as in tiktoken); U+FEFF is not (unlike JavaScript's \s).
  EXPECT_EQ(pieces(" \xc2\x85"
                   "b"),
            (Pieces{" ", "\xc2\x85", "b"}));
  EXPECT_EQ(pieces(" \xef\xbb\xbf"
                   "b"),
            (Pieces{" \xef\xbb\xbf", "b"}));
}

TEST(Gpt2Pieces, InvalidUtf8IsOneOtherCodePointPerByte) {
  EXPECT_EQ(pieces("a\xff\xfe"
                   "b"),
            (Pieces{"a", "\xff\xfe", "b"}));
  EXPECT_EQ(pieces(" \xffx"), (Pieces{" \xff", "x"}));
  EXPECT_EQ(pieces("caf\xc3"), (Pieces{"caf", "\xc3"})); // cut short
  EXPECT_EQ(pieces("\xc3"
                   "a"),
            (Pieces{"\xc3", "a"}));                          // lead byte, no continuation
  EXPECT_EQ(pieces("x\xc0\xaf"), (Pieces{"x", "\xc0\xaf"})); // overlong '/'
  EXPECT_EQ(pieces("x\xed\xa0\x80y"), (Pieces{"x", "\xed\xa0\x80", "y"})); // a surrogate
  EXPECT_EQ(pieces("\xe2\x82x"), (Pieces{"\xe2\x82", "x"}));
  EXPECT_EQ(pieces("\xf4\x90\x80\x80"), (Pieces{"\xf4\x90\x80\x80"})); // above U+10FFFF
  EXPECT_EQ(pieces("\xbf"
                   "1"),
            (Pieces{"\xbf", "1"}));
  // A lone byte is not white space: " \x80 x" is a space and a byte, then " x".
  EXPECT_EQ(pieces(" \x80 x"), (Pieces{" \x80", " x"}));
}

TEST(Gpt2Pieces, ConcatenateToTheText) {
  std::mt19937 gen(7);
  const std::vector<std::string> bits = {" ",
                                         "  ",
                                         "\n",
                                         "\t",
                                         "a",
                                         "Z",
                                         "'s",
                                         "'",
                                         "1",
                                         "!",
                                         "\xc3\xa9",
                                         "\xe3\x80\x80",
                                         "\xf0\x9f\x98\x80",
                                         "\xff",
                                         "\xe2\x82",
                                         "\xc2\xa0"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = static_cast<int>(gen() % 40);
    for (int k = 0; k < n; ++k)
      text += bits[gen() % bits.size()];
    std::string joined;
    for (const auto& p : pieces(text)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    EXPECT_EQ(joined, text);
  }
}

TEST(Gpt2Cut, PiecesOnEitherSideAreThoseOfTheWhole) {
  std::mt19937 gen(11);
  const std::vector<std::string> bits = {" ",
                                         "  ",
                                         "\n",
                                         "\t",
                                         "a",
                                         "bc",
                                         "'s",
                                         "'",
                                         "7",
                                         "?!",
                                         "\xc3\xa9",
                                         "\xe3\x80\x80",
                                         "\xf0\x9f\x98\x80",
                                         "\xff",
                                         "\xc2\x85",
                                         "\xe6\x97\xa5"};
  int cuts = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int n = static_cast<int>(gen() % 30);
    for (int k = 0; k < n; ++k)
      text += bits[gen() % bits.size()];
    const std::size_t from = text.empty() ? 0 : gen() % text.size();
    const std::size_t cut = gpt2_cut(text, from);
    ASSERT_LE(cut, text.size());
    if (cut == text.size())
      continue;
    ++cuts;
    EXPECT_GE(cut, from);
    Pieces both = pieces(text.substr(0, cut));
    for (const auto& p : pieces(text.substr(cut)))
      both.push_back(p);
    EXPECT_EQ(both, pieces(text)) << "cut at " << cut;
  }
  EXPECT_GT(cuts, 100);
  EXPECT_EQ(gpt2_cut("abc def", 0), 3u);
  EXPECT_EQ(gpt2_cut("abc  def", 4), 8u); // inside a run of white space: none after
  EXPECT_EQ(gpt2_cut("\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5", 1), 9u);
}

// ---- encoding by hand ------------------------------------------------------------

TEST(BpeEncode, SmallTableByHand) {
  const Bpe bpe = tiktoken(ranks_with(kSmall));
  BpeEncoder enc(bpe);
  // A piece that is a token is that token.
  EXPECT_EQ(enc.encode("abc"), (Ids{258}));
  EXPECT_EQ(enc.encode("bcd"), (Ids{260}));
  // abcd: ab 256, bc 257, cd 259 -> ab first; then abc 258 < cd 259 -> [abc][d].
  EXPECT_EQ(enc.encode("abcd"), (Ids{258, 'd'}));
  // xbcd: bc 257 first; then xbc (none), bcd 260 -> [x][bcd].
  EXPECT_EQ(enc.encode("xbcd"), (Ids{'x', 260}));
  // abab: ab at 0 and 2 tie, the left one first; aba is no token, ab -> [ab][ab].
  EXPECT_EQ(enc.encode("abab"), (Ids{256, 256}));
  // " ab" is one piece: " a" 261 vs ab 256 -> ab, then " ab" is none -> [ ][ab].
  EXPECT_EQ(enc.encode(" ab"), (Ids{' ', 256}));
  // " a" alone is a token; "a b" is three pieces... "a", " b".
  EXPECT_EQ(enc.encode(" a"), (Ids{261}));
  EXPECT_EQ(enc.encode("a b"), (Ids{'a', ' ', 'b'}));
  // "abc abcd": pieces "abc", " abcd": " a" 261 loses to ab 256; then abc 258 -> [ ][abc][d].
  EXPECT_EQ(enc.encode("abc abcd"), (Ids{258, ' ', 258, 'd'}));
  // Bytes outside any token stay single bytes, whatever they are.
  EXPECT_EQ(enc.encode(std::string("\xff\x00", 2)), (Ids{255, 0}));
  EXPECT_EQ(enc.encode(""), Ids{});
  // The cache gives the same again.
  EXPECT_EQ(enc.encode("abcd abcd abcd"), (Ids{258, 'd', ' ', 258, 'd', ' ', 258, 'd'}));
}

TEST(BpeEncode, LeftmostOfEqualRanksFirst) {
  // 256 "aa", 257 "aaa".
  const Bpe bpe = tiktoken(ranks_with({"aa", "aaa"}));
  BpeEncoder enc(bpe);
  EXPECT_EQ(enc.encode("aaa"), (Ids{257}));
  // aaaa: [aa][a][a], then aa (256) beats aaa (257) -> [aa][aa].
  EXPECT_EQ(enc.encode("aaaa"), (Ids{256, 256}));
  // aaaaa: [aa][a][a][a]; aa at 1 beats aaa -> [aa][aa][a]; aaa -> [aa][aaa].
  EXPECT_EQ(enc.encode("aaaaa"), (Ids{256, 257}));
}

TEST(BpeEncode, LongPiecesAgreeWithAPlainBpe) {
  // A table over a, b, c grown by joining random tokens; text mostly of letters, so
  // that pieces are long enough for both merge paths (short and heap).
  std::mt19937 gen(3);
  std::vector<std::string> tokens = {"a", "b", "c"};
  std::vector<std::string> merged;
  std::map<std::string, int> ranks;
  for (int b = 0; b < 256; ++b)
    ranks[std::string(1, static_cast<char>(b))] = b;
  while (merged.size() < 300) {
    const std::string t = tokens[gen() % tokens.size()] + tokens[gen() % tokens.size()];
    if (ranks.count(t) != 0 || t.size() > 12)
      continue;
    ranks[t] = 256 + static_cast<int>(merged.size());
    merged.push_back(t);
    tokens.push_back(t);
  }
  const Bpe bpe = tiktoken(ranks_with(merged));
  BpeEncoder enc(bpe);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(gen() % (trial < 150 ? 60 : 400));
    for (int k = 0; k < n; ++k)
      text += gen() % 25 == 0 ? ' ' : static_cast<char>('a' + gen() % 3);
    Ids expected;
    for (const auto& p : pieces(text))
      for (std::int32_t id : plain_bpe(ranks, p))
        expected.push_back(id);
    EXPECT_EQ(enc.encode(text), expected) << text;
  }
}

TEST(BpeEncode, DecodeGivesTheBytesBack) {
  const Bpe bpe = tiktoken(ranks_with(kSmall));
  BpeEncoder enc(bpe);
  std::mt19937 gen(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(gen() % (trial < 100 ? 50 : 3000), '\0');
    for (char& c : text)
      c = static_cast<char>(trial % 2 == 0 ? gen() % 256 : "abcd \n'"[gen() % 7]);
    EXPECT_EQ(bpe.decode(enc.encode(text)), text);
  }
  EXPECT_EQ(bpe.decode({bpe.end_of_text()}), "<|endoftext|>");
}

TEST(BpeEncode, EndOfTextInTheTextIsText) {
  const Bpe bpe = tiktoken(ranks_with(kSmall));
  BpeEncoder enc(bpe);
  const Ids ids = enc.encode("<|endoftext|>");
  EXPECT_EQ(ids.size(), 13u);
  for (std::int32_t id : ids)
    EXPECT_NE(id, bpe.end_of_text());
}

// ---- vocabulary files -------------------------------------------------------------

TEST(BpeFiles, TiktokenAndVocabMergesAgree) {
  TempDir dir;
  const std::string ranks = dir.write("small.tiktoken", tiktoken_text(ranks_with(kSmall)));
  const std::string vocab = dir.write("vocab.json", small_vocab_json());
  dir.write("merges.txt", kSmallMerges);
  const Bpe a = Bpe::load("gpt2", ranks);
  const Bpe b = Bpe::load("gpt2", vocab); // merges.txt beside it
  EXPECT_EQ(a.end_of_text(), 262);        // after the largest rank
  EXPECT_EQ(b.end_of_text(), 262);        // as vocab.json says
  EXPECT_EQ(a.id_limit(), 263);
  EXPECT_EQ(b.id_limit(), 263);
  EXPECT_EQ(b.bytes_of(261), " a");
  EXPECT_EQ(b.bytes_of(32), " ");
  EXPECT_EQ(b.bytes_of(0), std::string(1, '\0'));
  BpeEncoder ea(a), eb(b);
  std::mt19937 gen(9);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(gen() % 80, '\0');
    for (char& c : text)
      c = "abcd \n'x"[gen() % 8];
    EXPECT_EQ(ea.encode(text), eb.encode(text)) << text;
  }
  // --merges names the file when it is elsewhere.
  fs::create_directories(dir.path("other"));
  dir.write("other/m.txt", kSmallMerges);
  dir.write("other/vocab.json", small_vocab_json());
  EXPECT_EQ(Bpe::load("gpt2", dir.path("other/vocab.json"), dir.path("other/m.txt")).end_of_text(),
            262);
}

TEST(BpeFiles, MergeRanksAreTheirOrderInMergesTxt) {
  // The same tokens, merges in another order: b c before a b changes "abc".
  TempDir dir;
  std::string vocab = small_vocab_json();
  const Bpe first = Bpe::from_vocab_merges(vocab, "a b\nb c\n", "v.json", "m.txt");
  const Bpe second = Bpe::from_vocab_merges(vocab, "b c\na b\n", "v.json", "m.txt");
  // "abx": with a b first -> [ab][x]; ab is the only pair either way.
  EXPECT_EQ(BpeEncoder(first).encode("abx"), (Ids{256, 'x'}));
  // "abcx": a b first -> [ab][c][x] (abc is not mergeable here); b c first -> [a][bc][x].
  EXPECT_EQ(BpeEncoder(first).encode("abcx"), (Ids{256, 'c', 'x'}));
  EXPECT_EQ(BpeEncoder(second).encode("abcx"), (Ids{'a', 257, 'x'}));
}

TEST(BpeFiles, BadRanksFiles) {
  const auto bad = [](const std::string& text) {
    return error_of([&] { Bpe::from_tiktoken(text, "r.tiktoken"); });
  };
  const std::string good = tiktoken_text(ranks_with({"ab"}));
  std::string msg = bad(good + "YW!= 300\n");
  EXPECT_HAS(msg, "r.tiktoken: line 258: 'YW!=' is not base64");
  msg = bad(good + "YWI 300\n");
  EXPECT_HAS(msg, "line 258: 'YWI' is not base64");
  msg = bad(good + "YWJj x12\n");
  EXPECT_HAS(msg, "line 258: the rank 'x12' is not an integer");
  msg = bad(good + "YWJj -1\n");
  EXPECT_HAS(msg, "the rank '-1' is not an integer in [0, 16777215]");
  msg = bad(good + "YWJj 99999999999\n");
  EXPECT_HAS(msg, "the rank '99999999999' is not an integer");
  msg = bad(good + "YWJj 256\n");
  EXPECT_HAS(msg, "line 258: rank 256 is also the rank of line 257: each rank names one token");
  msg = bad(good + "YWI= 300\n");
  EXPECT_HAS(msg, "line 258: the token 'ab' is also on line 257: each token has one rank");
  msg = bad(good + "YWJj 300 1\n");
  EXPECT_HAS(msg, "line 258: 'YWJj 300 1' is not two fields");
  msg = bad("");
  EXPECT_HAS(msg, "r.tiktoken: no tokens");
  // A byte-level vocabulary has every byte.
  std::string missing;
  for (const auto& [b, r] : ranks_with({}))
    if (b != "A")
      missing += base64(b) + " " + std::to_string(r) + "\n";
  msg = bad(missing);
  EXPECT_HAS(msg, "no token is the single byte 0x41");
  // A JSON file given as a ranks file says it is not one.
  msg = bad("{\"a\": 0}\n");
  EXPECT_HAS(msg, "line 1: '{\"a\":' is not base64");
  EXPECT_HAS(msg, "a .tiktoken ranks file has one token a line, its bytes in base64, a space and "
                  "its rank");
}

TEST(BpeFiles, BadVocabJson) {
  const auto bad = [](const std::string& vocab, const std::string& merges = "") {
    return error_of([&] { Bpe::from_vocab_merges(vocab, merges, "v.json", "m.txt"); });
  };
  const std::string rule = "vocab.json must be one JSON object of token strings to integer ids";
  std::string msg = bad("[1, 2]");
  EXPECT_HAS(msg, "v.json: the document is an array, not an object: " + rule);
  msg = bad("\"a\"");
  EXPECT_HAS(msg, "v.json: the document is \"a\", not an object");
  msg = bad("{\"a\": \"x\"}");
  EXPECT_HAS(msg, "v.json: the id of the token \"a\" is \"x\", not an integer in [0, 16777215]: " +
                      rule);
  msg = bad("{\"a\": 1.5}");
  EXPECT_HAS(msg, "the id of the token \"a\" is 1.5, not an integer");
  msg = bad("{\"a\": -3}");
  EXPECT_HAS(msg, "the id of the token \"a\" is -3, not an integer");
  msg = bad("{\"a\": 16777216}");
  EXPECT_HAS(msg, "the id of the token \"a\" is 16777216, not an integer");
  msg = bad("{\"a\": [1]}");
  EXPECT_HAS(msg, "the id of the token \"a\" is an array, not an integer");
  // Syntax errors come from the JSON reader, with the line and column.
  msg = bad("{\"a\": 1,}");
  EXPECT_HAS(msg, "v.json: line 1, column 9: a member name (a string) expected, found '}'");
  msg = bad("{\"a\": 1} x");
  EXPECT_HAS(msg, "line 1, column 10: unexpected 'x' after the end of the document");
  msg = bad("{\"a\": 1");
  EXPECT_HAS(msg, "line 1, column 8: ',' or '}' expected in an object, found end of the text");
  msg = bad("{\"\\ud800\": 1}");
  EXPECT_HAS(msg, "a high surrogate \\u escape must be followed by a low one");
  msg = bad("{\"a\": 1,\n \"a\": 2}");
  EXPECT_HAS(msg, "v.json: line 2, column 2: the key \"a\" appears twice in one object");
  msg = bad("{\"a b\": 1}");
  EXPECT_HAS(msg, "v.json: the token \"a b\" has the character U+0020, which is none of the 256 "
                  "characters");
  msg = bad("{\"\\u0000\": 1}");
  EXPECT_HAS(msg, "has the character U+0000, which is none of the 256 characters");
  msg = bad("{\"\xff\": 1}");
  EXPECT_HAS(msg, "v.json: the token '\\xff' is not UTF-8: " + rule);
  msg = bad("{\"\": 1}");
  EXPECT_HAS(msg, "v.json: the token \"\" is empty: " + rule);
  msg = bad("{\"a\": 1, \"b\": 1}");
  EXPECT_HAS(msg, "v.json: the tokens \"a\" and \"b\" both have id 1: each id names one token");
  msg = bad("{\"a\": 1}");
  EXPECT_HAS(msg, "v.json: no token <|endoftext|>");
  msg = bad("{\"<|endoftext|>\": 0, \"a\": 1}");
  EXPECT_HAS(msg, "no token is the single byte 0x00");
}

TEST(BpeFiles, BadMergesTxt) {
  const auto bad = [](const std::string& merges) {
    return error_of([&] { Bpe::from_vocab_merges(small_vocab_json(), merges, "v.json", "m.txt"); });
  };
  std::string msg = bad("#version: 0.2\na b\nabc\n");
  EXPECT_HAS(msg, "m.txt: line 3: 'abc' is not two tokens: merges.txt has one merge a line");
  msg = bad("a b c\n");
  EXPECT_HAS(msg, "line 1: 'a b c' is not two tokens");
  msg = bad("a  b\n");
  EXPECT_HAS(msg, "line 1: 'a  b' is not two tokens");
  msg = bad("a b\nab zz\n");
  EXPECT_HAS(msg, "line 2: the token 'zz' is not in v.json");
  msg = bad("b a\n");
  EXPECT_HAS(msg, "line 1: the merge makes 'ba', which is not in v.json");
  msg = bad("a b\nb c\nab c\na bc\n");
  EXPECT_HAS(msg, "line 4: the merge makes 'abc', which line 3 makes already");
  msg = bad("a \xc5\x84\n"); // U+0144: past GPT-2's byte characters (U+0021..U+0143)
  EXPECT_HAS(msg, "line 1: '\\xc5\\x84' has the character U+0144");
}

TEST(BpeFiles, LoadNamesTheFileAndTheRule) {
  TempDir dir;
  std::string msg = error_of([&] { Bpe::load("gpt3", dir.path("x.tiktoken")); });
  EXPECT_HAS(msg, "--bpe gpt3: no such BPE; cubelm knows gpt2");
  msg = error_of([&] { Bpe::load("gpt2", dir.path("none.tiktoken")); });
  EXPECT_HAS(msg, "none.tiktoken: cannot open the BPE ranks file (.tiktoken): no such file");
  const std::string vocab = dir.write("vocab.json", small_vocab_json());
  msg = error_of([&] { Bpe::load("gpt2", vocab); });
  EXPECT_HAS(msg, dir.path("merges.txt") + ": cannot open the BPE merges file");
  const std::string ranks = dir.write("r.tiktoken", tiktoken_text(ranks_with(kSmall)));
  msg = error_of([&] { Bpe::load("gpt2", ranks, dir.path("merges.txt")); });
  EXPECT_HAS(msg, "a merges file goes with a vocab.json");
}

// ---- files ---------------------------------------------------------------------------

TEST(BpeFiles, TextToLlmcOnThreadsIsEachFileWhole) {
  TempDir dir;
  const Bpe bpe = tiktoken(ranks_with(kSmall));
  std::mt19937 gen(13);
  const std::vector<std::string> bits = {"abcd",     " abc", "bcd", "  ", "\n",
                                         "\t",       "'s",   "xyz", " ",  "\xe3\x80\x80",
                                         "\xc3\xa9", "\xff", "12",  "!"};
  std::vector<std::string> files;
  Ids expected;
  BpeEncoder reference(bpe);
  for (int f = 0; f < 4; ++f) {
    std::string text;
    const int n = f == 2 ? 0 : 2000 + static_cast<int>(gen() % 2000);
    for (int k = 0; k < n; ++k)
      text += bits[gen() % bits.size()];
    files.push_back(dir.write("t" + std::to_string(f) + ".txt", text));
    if (f > 0)
      expected.push_back(bpe.end_of_text());
    reference.encode(text, expected);
  }
  for (int threads : {1, 3}) {
    BpeRunOptions options;
    options.threads = threads;
    options.chunk_bytes = 97; // many cuts, and blocks that end inside code points
    int reports = 0;
    options.progress_seconds = 0.0;
    options.progress = [&](const BpeProgress& p) {
      ++reports;
      EXPECT_LE(p.bytes_done, p.bytes_total);
    };
    const BpeRunResult r = bpe_text_to_llmc(bpe, files, dir.path("o.bin"), options);
    EXPECT_EQ(r.tokens, static_cast<std::int64_t>(expected.size()));
    EXPECT_EQ(read_llmc(dir.path("o.bin"), bpe.id_limit()), expected);
    std::ostringstream text;
    EXPECT_EQ(llmc_to_text(dir.path("o.bin"), &bpe, text),
              static_cast<std::int64_t>(expected.size()));
    EXPECT_EQ(text.str(), read(files[0]) + "<|endoftext|>" + read(files[1]) + "<|endoftext|>" +
                              "<|endoftext|>" + read(files[3]));
  }
}

TEST(BpeFiles, TextToLlmcRefusals) {
  TempDir dir;
  const std::string text = dir.write("a.txt", "abc");
  // Ids past 65535 do not fit an llm.c file.
  auto ranks = ranks_with({"ab"});
  ranks.back().second = 70000;
  const Bpe wide = tiktoken(ranks);
  std::string msg = error_of([&] { bpe_text_to_llmc(wide, {text}, dir.path("o.bin")); });
  EXPECT_HAS(msg, "ranks.tiktoken: its ids go up to 70001: an llm.c token file stores uint16 "
                  "tokens, in [0, 65535]");
  EXPECT_FALSE(fs::exists(dir.path("o.bin")));
  const Bpe bpe = tiktoken(ranks_with(kSmall));
  msg = error_of([&] { bpe_text_to_llmc(bpe, {text}, text); });
  EXPECT_HAS(msg, "also an input file");
  msg = error_of([&] { bpe_text_to_llmc(bpe, {dir.path("no.txt")}, dir.path("o.bin")); });
  EXPECT_HAS(msg, "no.txt: cannot open the text file: no such file");
}

TEST(BpeFiles, DecodeRefusesIdsOutsideTheVocabulary) {
  TempDir dir;
  auto ranks = ranks_with({"ab"});
  ranks.back().second = 300; // ids 257..299 name nothing
  const Bpe bpe = tiktoken(ranks);
  EXPECT_TRUE(bpe.has(300));
  EXPECT_FALSE(bpe.has(299));
  EXPECT_EQ(bpe.end_of_text(), 301);
  std::string msg = error_of([&] { bpe.decode({97, 299}); });
  EXPECT_HAS(msg, "ranks.tiktoken: id 299 (at 1) names no token of the vocabulary (ids 0..301)");
  write_llmc(dir.path("t.bin"), {97, 300, 301, 299});
  std::ostringstream out;
  msg = error_of([&] { llmc_to_text(dir.path("t.bin"), &bpe, out); });
  EXPECT_HAS(msg, "t.bin: token 3 is 299, which names no token of ranks.tiktoken (ids 0..301)");
  write_llmc(dir.path("u.bin"), {97, 400});
  msg = error_of([&] { llmc_to_text(dir.path("u.bin"), &bpe, out); });
  EXPECT_HAS(msg, "token 1 is 400");
  // Without a vocabulary each id is a byte.
  write_llmc(dir.path("b.bin"), {104, 105, 0, 255});
  std::ostringstream bytes;
  EXPECT_EQ(llmc_to_text(dir.path("b.bin"), nullptr, bytes), 4);
  EXPECT_EQ(bytes.str(), std::string("hi\0\xff", 4));
  msg = error_of([&] { llmc_to_text(dir.path("t.bin"), nullptr, bytes); });
  EXPECT_HAS(msg, "token 1 (byte offset 1026) is 300, outside the vocabulary");
}
