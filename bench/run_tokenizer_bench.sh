#!/usr/bin/env bash
# Orchard vs tiktoken (npm, WASM), and for a SentencePiece-style file vs
# transformers.js's tokenizer (npm @lenml/tokenizers): single-core encode
# throughput, same text, same vocabulary. Run from the repository root after ./orchard.sh build.
#   bench/run_tokenizer_bench.sh [TEXT_FILE]
# Default text: Debian's license texts and Orchard's own sources, repeated to
# ~4 MB (English prose plus C++ code). Needs node and npm.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
text=${1:-$work/text.txt}
if [ -z "${1:-}" ]; then
  for i in 1 2 3 4 5 6 7 8; do
    cat /usr/share/common-licenses/* "$root"/src/*/*.cpp "$root"/src/*/*.h
  done > "$text"
fi
(cd "$work" && npm init -y >/dev/null && npm install --silent --no-save tiktoken@1.0.22 @lenml/tokenizers@3.7.2 >/dev/null 2>&1)
cp "$root/bench/peers/tiktoken_encode.mjs" "$root/bench/peers/transformersjs_encode.mjs" "$work/"
for enc in gpt2 cl100k_base; do
  echo "== $enc"
  taskset -c 0 "$root/build/orchard_bench_tokenizer" "$root/tests/fixtures/tokenizers/$enc" "$text" 5
  (cd "$work" && taskset -c 0 node tiktoken_encode.mjs "$enc" "$text" 5)
done
# SentencePiece-style (Mistral's 32,000-token file) against transformers.js's
# tokenizer, on the first 400 kB: the peer is too slow for the whole text.
head -c 400000 "$text" > "$work/head.txt"
echo "== mistral (SentencePiece-style), first 400 kB"
taskset -c 0 "$root/build/orchard_bench_tokenizer" "$root/tests/fixtures/tokenizers/mistral" "$work/head.txt" 3
(cd "$work" && taskset -c 0 node transformersjs_encode.mjs "$root/tests/fixtures/tokenizers/mistral" head.txt 1)
