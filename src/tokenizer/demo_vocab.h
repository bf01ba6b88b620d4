// A small, self-made vocabulary for the project's generated test models, so
// that tests need no downloaded tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace tandem {

// Fewest tokens make_demo_vocab() accepts: the 256 byte tokens, a few merges
// and the 3 special tokens.
inline constexpr int32_t kMinDemoVocab = 256 + 8 + 3;

// A byte-level BPE ("gpt2") vocabulary of exactly n_vocab tokens, the same for
// the same arguments:
//  - ids 0..255: the byte tokens, id = byte value, in GPT-2's printable form;
//  - then merges learned by BPE training on demo_corpus(), pre-tokenized with
//    `pre` (so no merge crosses a word), most frequent pair first;
//  - if those run out, synthetic merges that extend lower-case words
//    ("Ġ?[a-z]+" plus one letter), each a new token;
//  - the last 3 ids: CONTROL tokens "<|endoftext|>" (BOS and EOS),
//    "<|im_start|>", "<|im_end|>" (EOT).
// add_bos and add_eos are false. Throws tandem::Error if n_vocab < kMinDemoVocab
// or `pre` is not a supported pre-tokenizer.
VocabData make_demo_vocab(int32_t n_vocab, const std::string& pre);

// A ChatML chat template (Jinja) for tokenizer.chat_template.
std::string demo_chat_template();

// The training text (a few KB of plain English and some code).
std::string_view demo_corpus();

}  // namespace tandem
