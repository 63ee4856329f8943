// tokenizer.json reader and ByteLevel decoder (semantics in detokenizer.h).
#include "gatehouse/worker/detokenizer.h"

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gatehouse::worker {
namespace {

/// Inverse of GPT-2's bytes_to_unicode (tokenizers/src/pre_tokenizers/byte_level.rs): printable
/// Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves, the other 68 bytes
/// for U+0100 + n in byte order. Index: code point (< 0x144); value: byte, or -1.
const std::array<int, 0x144>& CharToByte() {
  static const std::array<int, 0x144> table = [] {
    std::array<int, 0x144> t;
    t.fill(-1);
    int next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[printable ? b : next++] = b;
    }
    return t;
  }();
  return table;
}

/// The code points of well-formed UTF-8 `s` (JSON strings are well-formed once parsed).
std::vector<uint32_t> CodePoints(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len && i + k < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

/// One token's bytes under the ByteLevel decoder: every character mapped back to its byte, or
/// the token's own UTF-8 when a character is outside the table.
void AppendTokenBytes(const std::string& token, std::string& bytes) {
  const auto& table = CharToByte();
  std::string mapped;
  for (uint32_t cp : CodePoints(token)) {
    if (cp >= table.size() || table[cp] < 0) {
      bytes += token;
      return;
    }
    mapped.push_back(static_cast<char>(table[cp]));
  }
  bytes += mapped;
}

Result<int64_t> IdOf(const nlohmann::json& value, const std::string& where) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    return Status::InvalidArgument(where + " is " + value.dump() +
                                   "; expected a non-negative integer id");
  }
  return value.get<int64_t>();
}

}  // namespace

std::string Utf8Lossy(const std::string& bytes) {
  static const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // Expected length and the allowed range of the second byte (Unicode Table 3-7).
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    if (len == 0) {  // a continuation byte or C0, C1, F5..FF: a subpart of one byte
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;  // bytes of the maximal well-formed prefix
    while (k < len && i + k < n) {
      const auto b = static_cast<unsigned char>(bytes[i + k]);
      const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) break;
      ++k;
    }
    if (k == len) {
      out.append(bytes, i, len);
    } else {
      out += kReplacement;
    }
    i += k;
  }
  return out;
}

Result<Detokenizer> Detokenizer::Open(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("no tokenizer file " + path.string());
  std::stringstream buf;
  buf << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  const std::string file = path.string();
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(file + " is not a JSON object");
  }
  const auto decoder = j.find("decoder");
  const std::string type = decoder != j.end() && decoder->is_object() && decoder->contains("type")
                               ? decoder->at("type").dump()
                               : (decoder == j.end() ? "absent" : decoder->dump());
  if (type != "\"ByteLevel\"") {
    return Status::InvalidArgument(file + ": field 'decoder.type' is " + type +
                                   "; only \"ByteLevel\" is implemented");
  }
  const auto model = j.find("model");
  if (model == j.end() || !model->is_object() || !model->contains("vocab") ||
      !model->at("vocab").is_object()) {
    return Status::InvalidArgument(file + ": field 'model.vocab' is missing or not an object");
  }
  Detokenizer d;
  auto put = [&d](int64_t id, const std::string& token) {
    if (id >= static_cast<int64_t>(d.tokens_.size())) {
      d.tokens_.resize(static_cast<size_t>(id) + 1);
      d.present_.resize(static_cast<size_t>(id) + 1, false);
    }
    if (!d.present_[id]) ++d.known_;
    d.tokens_[id] = token;
    d.present_[id] = true;
  };
  for (const auto& [token, id] : model->at("vocab").items()) {
    GH_ASSIGN_OR_RETURN(int64_t v, IdOf(id, file + ": field 'model.vocab." + token + "'"));
    put(v, token);
  }
  // Added tokens take precedence over the model's vocabulary (AddedVocabulary first).
  if (auto added = j.find("added_tokens"); added != j.end() && added->is_array()) {
    for (size_t i = 0; i < added->size(); ++i) {
      const auto& t = (*added)[i];
      const std::string where = file + ": field 'added_tokens[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("id") || !t.contains("content") ||
          !t.at("content").is_string()) {
        return Status::InvalidArgument(where + "' lacks an integer 'id' or a string 'content'");
      }
      GH_ASSIGN_OR_RETURN(int64_t v, IdOf(t.at("id"), where + ".id'"));
      put(v, t.at("content").get<std::string>());
    }
  }
  return d;
}

std::string Detokenizer::Decode(const std::vector<int64_t>& ids) const {
  std::string bytes;
  for (int64_t id : ids) {
    if (id < 0 || id >= static_cast<int64_t>(tokens_.size()) || !present_[id]) continue;
    AppendTokenBytes(tokens_[id], bytes);
  }
  return Utf8Lossy(bytes);
}

}  // namespace gatehouse::worker
