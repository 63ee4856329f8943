// Transport-neutral HTTP request and response, so routing (rest_api.h) is testable without
// sockets and Boost.Beast stays inside http_server.cc.
#pragma once

#include <map>
#include <string>

namespace gatehouse::controller {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // origin form: "/api/v1/cells?limit=5"
  std::map<std::string, std::string> headers;  // names lower-case
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::map<std::string, std::string> headers;  // extra headers, e.g. "Allow"
  /// Non-empty: the body is this file's contents, streamed from disk (body is ignored); an
  /// artifact may be larger than memory should hold.
  std::string file_path;
};

}  // namespace gatehouse::controller
