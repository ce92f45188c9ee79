#!/usr/bin/env bash
# `cubelm generate` as a user meets it (docs/generate.md).
#
#   generate.sh WORKDIR CUBELM MPIEXEC [MPIEXEC ARGS...] --
#
# Cases, in order (each names itself on failure):
#   layouts       a byte-vocabulary model trained 100 steps on the synthetic chain on 1 rank
#                 and on 2 ranks of 1d tensor parallelism: greedy decoding from either
#                 checkpoint, on one process, gives the same 16 bytes (at least 8 distinct
#                 ones: the model follows the chain); so does a second run
#   deck          --deck: under the 2-rank 1d deck on 2 processes (from either checkpoint)
#                 and under the 1-rank deck on one, greedy decoding gives the same 16 bytes,
#                 closing line naming the processes; a deck of another model is refused
#   prompts       --prompt TEXT, the same bytes as decimal ids in a file, and as an llm.c
#                 token file (`cubelm data`) give the same tokens
#   sampling      one seed twice: the same tokens; two seeds: different ones; top-k 1 at
#                 temperature 1 is greedy; the closing line on stderr
#   ids           a 64-token vocabulary prints ids separated by spaces; --prompt is refused
#   bpe           --vocab (a small .tiktoken): the prompt is the ids `cubelm data --bpe` writes,
#                 the output the generated ids' bytes; a BPE larger than the model is refused
#   bad-input     each bad option, prompt and checkpoint: exit status 1 (CLI11's own for
#                 syntax errors) and a message naming the thing, the value and the rule
#   help          `cubelm generate --help` lists every option
set -uo pipefail
work=$1 cubelm=$2
shift 2
launcher=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do launcher+=("$1"); shift; done
rm -rf "$work" && mkdir -p "$work" && cd "$work" || { echo "FAIL: no work directory $work"; exit 1; }
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false

case_name=setup
fail() { echo "FAIL: $case_name: $*"; exit 1; }

# deck NAME VOCAB DIR [EXTRA LINES...]: a tiny model, 100 steps; extra lines go under [parallel].
deck() {
  local name=$1 vocab=$2 dir=$3
  shift 3
  {
    printf '[model]\nvocab_size = %s\nseq_len = 32\nhidden = 32\nheads = 2\nlayers = 2\n' "$vocab"
    printf '[parallel]\n'
    for line in "$@"; do printf '%s\n' "$line"; done
    printf '[train]\nsteps = 100\nglobal_batch = 4\nseed = 5\n[optimizer]\nlr = 1e-2\n'
    printf '[data]\nsynthetic_tokens = 4000\nsynthetic_branching = 2\n'
    printf '[checkpoint]\ndir = "%s"\n[log]\npeak_gflops = 1.0\n' "$dir"
  } >"$name.toml"
}
# gen NAME ARGS...: cubelm generate ARGS; stdout in NAME.out, stderr in NAME.err, status in $rc.
gen() {
  local name=$1
  shift
  "$cubelm" generate "$@" >"$name.out" 2>"$name.err"
  rc=$?
}
# refused NAME STATUS REGEX ARGS...: the command exits with STATUS (syntax: any status but 0
# and 1, CLI11's own) and says REGEX (extended).
refused() {
  local name=$1 status=$2 regex=$3
  shift 3
  gen "$name" "$@"
  if [ "$status" = syntax ]; then
    [ $rc -gt 1 ] || fail "$name: exit status $rc, expected CLI11's: $(cat "$name.err")"
  else
    [ $rc -eq "$status" ] || fail "$name: exit status $rc, expected $status: $(cat "$name.err")"
  fi
  grep -Eq -- "$regex" "$name.err" || fail "$name: the message does not match /$regex/: $(cat "$name.err")"
  grep -q "Segmentation\|Aborted\|terminate called" "$name.err" && fail "$name crashed: $(cat "$name.err")"
  return 0
}

deck one 256 ckpt_one
deck two 256 ckpt_two 'tensor_mode = "1d"' 'tensor_size = 2'
"$cubelm" train one.toml >one.train 2>&1 || fail "training on 1 rank failed: $(tail -5 one.train)"
"${launcher[@]}" "$cubelm" train two.toml >two.train 2>&1 ||
  fail "training on 2 ranks failed: $(tail -5 two.train)"
one=ckpt_one/step_00000100.h5 two=ckpt_two/step_00000100.h5
[ -f $one ] && [ -f $two ] || fail "no step-100 checkpoints: $(ls ckpt_one ckpt_two)"

case_name=layouts
gen greedy_one $one --prompt "The cube" --tokens 16 --temperature 0
[ $rc -eq 0 ] || fail "generation from the 1-rank checkpoint failed: $(cat greedy_one.err)"
gen greedy_two $two --prompt "The cube" --tokens 16 --temperature 0
[ $rc -eq 0 ] || fail "generation from the 2-rank checkpoint failed: $(cat greedy_two.err)"
# 16 bytes and a newline.
[ "$(wc -c <greedy_one.out)" -eq 17 ] || fail "expected 16 bytes and a newline: $(od -c greedy_one.out)"
distinct=$(head -c 16 greedy_one.out | od -An -v -tu1 | tr -s ' ' '\n' | sed '/^$/d' | sort -u | wc -l)
[ "$distinct" -ge 8 ] || fail "only $distinct distinct bytes: $(od -An -tu1 greedy_one.out)"
cmp -s greedy_one.out greedy_two.out ||
  fail "greedy tokens differ between the layouts: $(od -An -tu1 greedy_one.out) vs $(od -An -tu1 greedy_two.out)"
gen greedy_again $one --prompt "The cube" --tokens 16 --temperature 0
cmp -s greedy_one.out greedy_again.out || fail "greedy decoding is not deterministic"

case_name=deck
"${launcher[@]}" "$cubelm" generate $one --deck two.toml --prompt "The cube" --tokens 16 --temperature 0 \
  >deck_two.out 2>deck_two.err || fail "generation under the 2-rank deck failed: $(cat deck_two.err)"
cmp -s greedy_one.out deck_two.out ||
  fail "greedy tokens under the 2-rank deck differ: $(od -An -tu1 deck_two.out) vs $(od -An -tu1 greedy_one.out)"
grep -Eq "^cubelm: generated 16 tokens in [0-9.]+ s: [0-9.]+ tokens/s \(prompt of 8 tokens in [0-9.]+ s\), 2 processes under the layout of two.toml$" deck_two.err ||
  fail "no closing line naming the layout: $(cat deck_two.err)"
"${launcher[@]}" "$cubelm" generate $two --deck two.toml --prompt "The cube" --tokens 16 --temperature 0 \
  >deck_two2.out 2>deck_two2.err || fail "generation from the 2-rank checkpoint under its deck failed: $(cat deck_two2.err)"
cmp -s greedy_one.out deck_two2.out || fail "greedy tokens from the 2-rank checkpoint under its deck differ"
gen deck_one $two --deck one.toml --prompt "The cube" --tokens 16 --temperature 0
[ $rc -eq 0 ] || fail "generation under the 1-rank deck failed: $(cat deck_one.err)"
cmp -s greedy_one.out deck_one.out || fail "greedy tokens under the 1-rank deck differ"
deck other 256 ckpt_other
sed -i 's/^hidden = 32$/hidden = 64/' other.toml
refused deck_other 1 "^cubelm: error: --deck other.toml: its model is not the checkpoint's \(model.hidden = 32 there, 64 in the deck; checkpoint ckpt_one/step_00000100.h5\)" \
  $one --deck other.toml --prompt x
refused deck_ranks 1 "the job has 1 processes but the layout" $one --deck two.toml --prompt x

case_name=prompts
# "The cube" as byte ids, in a text file and in an llm.c token file.
echo "84 104 101  32
99 117 98 101" >ids.txt
gen from_ids $one --prompt-tokens ids.txt --tokens 16 --temperature 0
cmp -s greedy_one.out from_ids.out || fail "the ids of the prompt's bytes give other tokens: $(cat from_ids.err)"
printf 'The cube' >prompt.txt
"$cubelm" data prompt.txt -o prompt.bin >/dev/null 2>&1 || fail "cubelm data failed"
gen from_llmc $one --prompt-tokens prompt.bin --tokens 16 --temperature 0
cmp -s greedy_one.out from_llmc.out || fail "the llm.c token file gives other tokens: $(cat from_llmc.err)"

case_name=sampling
gen seed7 $one --prompt "The cube" --tokens 24 --seed 7
gen seed7_again $one --prompt "The cube" --tokens 24 --seed 7
gen seed8 $one --prompt "The cube" --tokens 24 --seed 8
cmp -s seed7.out seed7_again.out || fail "the same seed gave different tokens"
cmp -s seed7.out seed8.out && fail "seeds 7 and 8 gave the same 24 tokens"
gen top1 $one --prompt "The cube" --tokens 16 --temperature 1 --top-k 1 --seed 3
cmp -s greedy_one.out top1.out || fail "top-k 1 is not greedy"
gen nucleus $one --prompt "The cube" --tokens 16 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 3
[ $rc -eq 0 ] || fail "top-k and top-p together failed: $(cat nucleus.err)"
grep -Eq "^cubelm: generated 24 tokens in [0-9.]+ s: [0-9.]+ tokens/s \(prompt of 8 tokens in [0-9.]+ s\)$" seed7.err ||
  fail "no closing line: $(cat seed7.err)"

case_name=ids
deck wide 64 ckpt_wide
"$cubelm" init wide.toml -o wide.h5 >/dev/null 2>&1 || fail "cubelm init failed"
echo "1 2 3" >wide_ids.txt
gen wide wide.h5 --prompt-tokens wide_ids.txt --tokens 10 --temperature 0
[ $rc -eq 0 ] || fail "ids generation failed: $(cat wide.err)"
grep -Eq '^[0-9]+( [0-9]+){9}$' wide.out || fail "expected 10 ids separated by spaces: $(cat wide.out)"
refused wide_text 1 "--prompt TEXT needs the byte vocabulary \(model.vocab_size = 256\) or a BPE vocabulary \(--vocab FILE\); this checkpoint's model has vocab_size = 64: give --vocab, or the prompt's token ids with --prompt-tokens FILE" \
  wide.h5 --prompt "hello"

case_name=bpe
# A BPE of 269 ids (tests/bpe/small.tiktoken) on a model of 300: --vocab encodes the prompt
# as `cubelm data --bpe` does and prints each token's bytes.
small=$(dirname "${BASH_SOURCE[0]}")/bpe/small.tiktoken
deck bpe 300 ckpt_bpe
"$cubelm" init bpe.toml -o bpe.h5 >/dev/null 2>&1 || fail "cubelm init failed"
printf 'the cube' >bpe_prompt.txt
"$cubelm" data --bpe gpt2 --vocab "$small" bpe_prompt.txt -o bpe_prompt.bin >/dev/null 2>&1 ||
  fail "cubelm data --bpe failed"
gen bpe_text bpe.h5 --vocab "$small" --prompt "the cube" --tokens 12 --temperature 0
[ $rc -eq 0 ] || fail "generation with --vocab failed: $(cat bpe_text.err)"
gen bpe_ids bpe.h5 --prompt-tokens bpe_prompt.bin --tokens 12 --temperature 0
[ $rc -eq 0 ] || fail "generation from the prompt's ids failed: $(cat bpe_ids.err)"
n=$((($(stat -c %s bpe_prompt.bin) - 1024) / 2)) # the llm.c header is 1024 bytes
grep -q "prompt of $n tokens" bpe_text.err || fail "--prompt is not the $n tokens cubelm data wrote: $(cat bpe_text.err)"
cmp -s bpe_text.out bpe_ids.out && fail "--vocab printed ids: $(cat bpe_text.out)"
# The ids' bytes from the ranks file itself (<|endoftext|>, 268, has none there).
: >bpe_expected.out
for id in $(cat bpe_ids.out); do
  if [ "$id" = 268 ]; then printf '<|endoftext|>' >>bpe_expected.out; continue; fi
  [ "$id" -lt 268 ] || { printf '<%s>' "$id" >>bpe_expected.out; continue; }
  awk -v id="$id" '$2 == id {print $1}' "$small" | base64 -d >>bpe_expected.out
done
echo >>bpe_expected.out
cmp -s bpe_text.out bpe_expected.out ||
  fail "--vocab printed other text than the ids' bytes: $(od -c bpe_text.out | head -3) vs $(od -c bpe_expected.out | head -3)"
refused bpe_too_big 1 "--vocab [^ ]*small.tiktoken: its ids go up to 268, beyond the model's vocabulary \(model.vocab_size = 256\)" \
  $one --vocab "$small" --prompt x

case_name=bad-input
refused top_p0 1 "^cubelm: error: --top-p 0: must be in \(0, 1\]" $one --prompt x --top-p 0
refused top_p2 1 "^cubelm: error: --top-p 1.5: must be in \(0, 1\]" $one --prompt x --top-p 1.5
refused top_k 1 "^cubelm: error: --top-k -1: must be >= 0" $one --prompt x --top-k -1
refused temperature 1 "^cubelm: error: --temperature -0.5: must be a finite number >= 0" $one --prompt x --temperature -0.5
refused tokens 1 "^cubelm: error: --tokens -3: must be >= 0" $one --prompt x --tokens -3
refused tokens_syntax syntax "--tokens = many" $one --prompt x --tokens many
refused no_prompt 1 "give the prompt once: --prompt TEXT or --prompt-tokens FILE" $one
refused two_prompts 1 "give the prompt once" $one --prompt x --prompt-tokens ids.txt
refused empty 1 "^cubelm: error: --prompt: the prompt is empty" $one --prompt ""
: >empty.txt
refused empty_file 1 "^cubelm: error: empty.txt: the prompt is empty" $one --prompt-tokens empty.txt
echo "65 300 66" >outside.txt
refused outside 1 "outside.txt: token 1 \(byte offset 3\) is 300, outside the vocabulary: every token must be in \[0, vocab_size\) with vocab_size = 256" \
  $one --prompt-tokens outside.txt
echo "65 -4" >negative.txt
refused negative 1 "negative.txt: token 1 \(byte offset 3\) is \"-4\", not a token id" $one --prompt-tokens negative.txt
refused no_prompt_file 1 "nope.txt: cannot open the token file: no such file" $one --prompt-tokens nope.txt
refused too_long 1 "the prompt's 8 tokens and --tokens 25 need 33 positions, more than the model's context of model.seq_len = 32" \
  $one --prompt "The cube" --tokens 25
refused no_checkpoint 1 "checkpoint nope.h5: no such file" nope.h5 --prompt x
refused not_checkpoint 1 "checkpoint ids.txt: not an HDF5 file" ids.txt --prompt x
head -c 20000 $one >truncated.h5
refused truncated 1 "^cubelm: error: .*truncated.h5" truncated.h5 --prompt x
"${launcher[@]}" "$cubelm" generate $one --prompt x >ranks.out 2>ranks.err
rc=$?
[ $rc -eq 1 ] || fail "2 ranks: exit status $rc: $(cat ranks.err)"
grep -q "cubelm generate without --deck runs on one process; this job has 2 (start it without mpiexec, or give --deck DECK to generate under its layout)" ranks.err || fail "2 ranks: $(cat ranks.err)"

case_name=help
"$cubelm" generate --help >help.out 2>&1 || fail "--help failed"
for option in checkpoint --prompt --prompt-tokens --deck --tokens --temperature --top-k --top-p --seed; do
  grep -q -- "$option" help.out || fail "--help does not list $option: $(cat help.out)"
done
echo "PASS: generate"
