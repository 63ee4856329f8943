// Response compression (controller/http_gzip.h), with zlib.
#include "controller/http_gzip.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace gatehouse::controller {
namespace {

constexpr size_t kMinBytes = 1024;

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool Compressible(std::string_view content_type) {
  const std::string type = Lower(content_type.substr(0, content_type.find(';')));
  return type == "application/json" || type.rfind("text/", 0) == 0 ||
         type == "application/javascript" || type == "image/svg+xml";
}

}  // namespace

bool AcceptsGzip(std::string_view accept_encoding) {
  bool gzip = false, wildcard = false;
  bool gzip_listed = false;
  while (!accept_encoding.empty()) {
    const size_t comma = accept_encoding.find(',');
    std::string_view item = accept_encoding.substr(0, comma);
    accept_encoding = comma == std::string_view::npos ? std::string_view()
                                                      : accept_encoding.substr(comma + 1);
    size_t semi = item.find(';');
    const std::string coding = Lower(Trim(item.substr(0, semi)));
    double q = 1.0;
    while (semi != std::string_view::npos) {  // each parameter; the q-value may be any of them
      item.remove_prefix(semi + 1);
      semi = item.find(';');
      const std::string param = Lower(Trim(item.substr(0, semi)));
      if (param.rfind("q=", 0) == 0) q = std::strtod(param.c_str() + 2, nullptr);
    }
    if (coding == "gzip" || coding == "x-gzip") {
      gzip_listed = true;
      gzip = q > 0;
    } else if (coding == "*") {
      wildcard = q > 0;
    }
  }
  return gzip_listed ? gzip : wildcard;
}

Result<std::string> Gzip(std::string_view data) {
  z_stream z{};
  // windowBits 15 + 16: a gzip header and trailer around the deflate stream.
  if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return Status::Internal("gzip: deflateInit2 failed");
  }
  std::string out(deflateBound(&z, static_cast<uLong>(data.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  const std::string why = z.msg != nullptr ? z.msg : "deflate returned " + std::to_string(rc);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) return Status::Internal("gzip: " + why);
  return out;
}

void CompressIfAccepted(const HttpRequest& request, HttpResponse& response) {
  if (!response.file_path.empty() || !Compressible(response.content_type)) return;
  for (const auto& [name, value] : response.headers) {
    if (Lower(name) == "content-encoding") return;
  }
  if (response.body.size() < kMinBytes) return;
  response.headers["Vary"] = "Accept-Encoding";
  const auto accept = request.headers.find("accept-encoding");
  if (accept == request.headers.end() || !AcceptsGzip(accept->second)) return;
  Result<std::string> packed = Gzip(response.body);
  if (!packed.ok()) return;  // sent as it is
  response.body = std::move(packed).value();
  response.headers["Content-Encoding"] = "gzip";
}

}  // namespace gatehouse::controller
