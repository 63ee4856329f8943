// Response compression for the REST API and dashboard (docs/protocols.md §2): a JSON or text
// answer of 1 KiB or more is sent gzip-encoded to a client that accepts gzip (every browser;
// curl with --compressed). The matrix of 100,000 cells is 316 KB of JSON; gzip makes it a tenth.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "controller/http_types.h"

namespace gatehouse::controller {

/// Whether an Accept-Encoding value (RFC 9110 §12.5.3) accepts gzip: "gzip" or "*" listed
/// with a q-value above 0 ("gzip;q=0" refuses it; "identity" alone does not offer it).
bool AcceptsGzip(std::string_view accept_encoding);

/// `data` as one gzip member (RFC 1952), zlib's level 6. Errors: INTERNAL with zlib's message.
Result<std::string> Gzip(std::string_view data);

/// Compresses `response` in place when `request` accepts gzip and the response is worth it: a
/// string body (not a streamed file) of at least 1 KiB, of a text type (JSON, text/*,
/// JavaScript, SVG), not already encoded. Sets Content-Encoding: gzip; adds Vary:
/// Accept-Encoding to every answer that qualifies, compressed or not, so a cache keeps both.
void CompressIfAccepted(const HttpRequest& request, HttpResponse& response);

}  // namespace gatehouse::controller
