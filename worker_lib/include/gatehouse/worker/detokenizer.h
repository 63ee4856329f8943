// Token ids -> text, so that the decode gate can show what a checkpoint actually says.
//
// The worker never tokenizes: prompts arrive as token ids in the reference bundle (made by
// transformers' tokenizer in tools/refgen). Showing the greedy continuation as text only needs
// the reverse direction, read from the checkpoint's tokenizer.json (the Hugging Face
// `tokenizers` format).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"

namespace gatehouse::worker {

/// Decodes token ids as transformers' `tokenizer.decode(ids)` does by default (special tokens
/// kept, no clean-up of spaces), for tokenizer.json files whose "decoder" is "ByteLevel": the
/// GPT-2 style byte-level BPE of Llama 3, Qwen2/3, SmolLM, GPT-2 and others.
///
/// Semantics follow the Rust `tokenizers` crate: each id becomes its token string (added tokens
/// first, then model.vocab; an id with neither is skipped, as upstream skips it); ByteLevel maps
/// every character of a token back to its byte through the inverse of GPT-2's bytes_to_unicode
/// table, or keeps the token's own UTF-8 bytes when one of its characters is outside the table;
/// the bytes of all tokens are joined and read as UTF-8 with each maximal invalid subpart
/// replaced by U+FFFD (String::from_utf8_lossy).
class Detokenizer {
 public:
  /// Reads tokenizer.json at `path`: model.vocab (token -> id), added_tokens ({id, content})
  /// and decoder.type. Errors: NOT_FOUND when the file is absent; INVALID_ARGUMENT naming the
  /// file and field when it is not JSON, lacks model.vocab, holds a negative or non-integer
  /// id, or has a decoder other than "ByteLevel" (the message names the decoder type found).
  static Result<Detokenizer> Open(const std::filesystem::path& path);

  /// The text of `ids`.
  std::string Decode(const std::vector<int64_t>& ids) const;

  /// Number of ids with a token string (vocab plus added tokens).
  int64_t size() const { return known_; }

 private:
  std::vector<std::string> tokens_;  // id -> token string (UTF-8)
  std::vector<bool> present_;        // id has a token
  int64_t known_ = 0;
};

/// `bytes` read as UTF-8, each maximal subpart of an ill-formed sequence replaced by one
/// U+FFFD (Unicode 15 §3.9 "U+FFFD Substitution of Maximal Subparts"; what Rust's
/// String::from_utf8_lossy does).
std::string Utf8Lossy(const std::string& bytes);

}  // namespace gatehouse::worker
